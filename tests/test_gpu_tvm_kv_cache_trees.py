"""GPU: TVM's PagedKVCache on CUDA with attngen's token-tree slots (speculative decoding).

- the two tree functions called directly against a float64 reference: random trees with branching (a forest,
  a single node, trees past one 64-row query tile and one 64-key tile), GQA, pages in random order, a
  committed prefix of up to several key tiles before the tree, trees longer than their queries (a tree
  extended before its commit), a request without a tree (a block shared with a fork, more queries than keys); the paged one also with length_info [3, B] on a library built for a layer
  window (the sliding-window view and the window at TVM's positions); outputs poisoned with NaN;
- whole caches through random token-tree scripts (tests/tvm_tree_model.py: interleaved prefills, a fork, a
  tree step of every sequence, commits of random accepted paths, trees extended before commit, decode), in
  both slot conventions and from a model library, against attngen's float32 CPU cache (whose tree slots
  test_tvm_kv_cache_tree.py checks against a float64 model and TVM's kernels); a cache with a
  "mha_sliding" layer; and against TVM's own CUDA tree kernels.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from .test_tvm_kv_cache_tree import depths, tree_order, tree_visible
from .tvm_tree_model import random_parents, run_tree_script, tree_script
from .tvm_window_model import LAYERS, SHAPE, WINDOW, attend, max_err

pytestmark = pytest.mark.gpu

HQ, HKV, D, PS, DTYPE = SHAPE.num_qo_heads, SHAPE.num_kv_heads, SHAPE.head_dim, SHAPE.page_size, SHAPE.dtype
SM = D ** -0.5


@pytest.fixture(scope="module")
def slots(build_cache):
    """window -> the slot functions of a library built for it (None: no windows, WINDOW: a layer window)."""
    from attngen.tvm.cuda import cuda_slot_functions
    from attngen.variants import builtin

    return {w: cuda_slot_functions(builtin("vanilla"), head_dim=D, dtype=DTYPE, window=w, cache=build_cache)
            for w in (None, WINDOW)}


def _cuda(a):
    import torch

    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def _poisoned(n):
    import torch

    return (torch.full((n, HQ, D), float("nan"), dtype=torch.float16, device="cuda"),
            torch.full((n, HQ), float("nan"), device="cuda"))


def _trees(rng, sizes):
    return [random_parents(rng, n) for n in sizes]


def test_ragged_tree_slot_matches_reference(slots, rng):
    import torch

    trees = _trees(rng, [6, 1, 70, 13]) + [[-1, -1, 0, 1, 2, 0, 3]]  # a single node, two tiles of rows, a forest
    lens = [len(t) for t in trees]
    indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    n = int(indptr[-1])
    q, k, v = (rng.standard_normal((n, h, D)).astype(np.float16) for h in (HQ, HKV, HKV))
    q_pos = np.concatenate([7 * b + np.array(depths(t)) for b, t in enumerate(trees)]).astype(np.int32)
    order = np.concatenate([tree_order(t) for t in trees])
    o, lse = _poisoned(n)
    slots[None]["prefill_tree_mask"](_cuda(q), _cuda(indptr), _cuda(k), _cuda(v), _cuda(indptr), _cuda(q_pos),
                                     _cuda(indptr), _cuda(order), o, lse, 0, 1.0, 1e4, SM)
    torch.cuda.synchronize()
    o, lse = o.float().cpu().numpy(), lse.cpu().numpy()
    for b, parents in enumerate(trees):
        rows = slice(indptr[b], indptr[b + 1])
        ref_o, ref_lse = attend(q[rows], k[rows], v[rows], tree_visible(parents, 0, range(len(parents))), SM)
        assert np.abs(o[rows] - ref_o).max() < 2e-2, b
        assert np.abs(lse[rows] - ref_lse).max() < 2e-2, b


def _paged_case(rng, requests):
    """Pages [P, 2, Hkv, PS, D] in random order holding, per request, a committed prefix then its tree (requests:
    (prefix, parents, n_queries)); returns the pool, page_indptr, page_indices, last page lengths and per request
    its keys / values [n, Hkv, D]."""
    blocks, page_indptr, last, keys = [], [0], [], []
    for prefix, parents, _ in requests:
        total = prefix + len(parents)
        n_pages = -(-total // PS)
        data = rng.standard_normal((n_pages, 2, HKV, PS, D)).astype(np.float16)
        rows = data.transpose(0, 3, 1, 2, 4).reshape(-1, 2, HKV, D)[:total]
        keys.append((rows[:, 0], rows[:, 1]))
        blocks += list(data)
        page_indptr.append(len(blocks))
        last.append(total - (n_pages - 1) * PS)
    perm = rng.permutation(len(blocks))  # block i lives at page perm[i]
    pool = np.stack(blocks)[np.argsort(perm)]
    return pool, np.array(page_indptr, np.int32), perm.astype(np.int32), np.array(last, np.int32), keys


def _paged_call(fn, rng, requests, length_info_of, k_pos0, visible_of):
    """Call the paged tree function ``fn`` on ``requests`` and compare with the float64 reference."""
    import torch

    pool, page_indptr, page_indices, last, keys = _paged_case(rng, requests)
    n_q = [nq for *_, nq in requests]
    qo_indptr = np.concatenate([[0], np.cumsum(n_q)]).astype(np.int32)
    tree_indptr = np.concatenate([[0], np.cumsum([len(p) for _, p, _ in requests])]).astype(np.int32)
    order = np.concatenate([tree_order(p) for _, p, _ in requests])
    q = rng.standard_normal((int(qo_indptr[-1]), HQ, D)).astype(np.float16)
    q_pos = np.concatenate([prefix + (np.array(depths(p))[len(p) - nq:] if p else np.arange(nq))
                            for prefix, p, nq in requests]).astype(np.int32)
    o, lse = _poisoned(len(q))
    fn(_cuda(q), _cuda(qo_indptr), _cuda(pool), _cuda(page_indptr), _cuda(page_indices), _cuda(length_info_of(last)),
       _cuda(k_pos0), _cuda(q_pos), o, lse, 0, 1.0, 1e4, SM, _cuda(tree_indptr), _cuda(order))
    torch.cuda.synchronize()
    o, lse = o.float().cpu().numpy(), lse.cpu().numpy()
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    for b, (prefix, parents, nq) in enumerate(requests):
        rows = slice(qo_indptr[b], qo_indptr[b + 1])
        mask = tree_visible(parents, prefix, range(len(parents) - nq, len(parents))) if parents else \
            np.ones((nq, prefix), bool)
        k, v, mask = visible_of(b, keys[b], mask, q_pos[rows])
        ref_o, ref_lse = attend(q[rows], k, v, mask, SM)
        assert np.abs(o[rows] - ref_o).max() < 2e-2, b
        assert np.abs(lse[rows] - ref_lse).max() < 2e-2, b


def _tree_requests(rng):
    """(committed prefix, the whole tree's parents, how many of its last nodes are the queries); no parents: a
    request whose tree lies in a deeper block of its sequence (TVM's paged tree slot carries such blocks shared with
    a fork: tree_len 0, every key visible, more queries than keys)."""
    big = random_parents(rng, 40) + random_parents(rng, 30, 40, 40)
    return [(21, random_parents(rng, 8), 8), (0, [-1, 0, 1, 0], 4), (150, big, 30), (5, [-1, -1, 0, 1, 2, 0, 3], 3),
            (10, [], 14), (16, [-1], 1), (63, random_parents(rng, 12), 12)]


def test_paged_tree_slot_matches_reference(slots, rng):
    requests = _tree_requests(rng)
    for fn in (slots[None]["prefill_tree_mask_paged"], slots[WINDOW]["prefill_tree_mask_paged"]):  # length_info [B]
        _paged_call(fn, rng, requests, lambda last: last, np.zeros(len(requests), np.int32),
                    lambda b, kv, mask, q_pos: (*kv, mask))


def test_paged_tree_slot_on_sliding_layers_matches_reference(slots, rng):
    """length_info [3, B] ("mha_sliding" layers): keys from each request's window offset on (no sinks), the layer
    window hiding keys WINDOW or more positions before a query (TVM's positions)."""
    requests = _tree_requests(rng)
    offsets = np.array([min(prefix, int(rng.integers(0, 20))) for prefix, *_ in requests], np.int32)

    def visible(b, kv, mask, q_pos):
        drop = int(offsets[b])
        mask = mask[:, drop:] & (q_pos[:, None] - (drop + np.arange(mask.shape[1] - drop))[None, :] < WINDOW)
        return kv[0][drop:], kv[1][drop:], mask

    _paged_call(slots[WINDOW]["prefill_tree_mask_paged"], rng, requests,
                lambda last: np.stack([last, offsets, np.zeros_like(last)]), offsets, visible)


# ---------------------------------------------------------------------------------------------
# whole caches


def _caches(shape, build_cache, ours):
    """name -> (cache, device, dtype): ``ours`` (a CUDA cache) and attngen's float32 CPU cache of ``shape``."""
    import tvm

    from attngen.tvm import create_paged_kv_cache

    cpu = create_paged_kv_cache(replace(shape, dtype="float32"), cache=build_cache)
    return {"attngen": (ours, tvm.cuda(), DTYPE), "cpu": (cpu, tvm.cpu(), "float32")}


def _model_library_cache(shape, build_cache, tmp_path):
    import tvm
    from tvm import relax

    from attngen.runtime.cuda import current_arch
    from attngen.tvm import export_model_library, paged_kv_cache_module

    arch = current_arch()
    mod = paged_kv_cache_module(shape, target="cuda", arch=arch, cache=build_cache)
    path = export_model_library(mod, tmp_path / "model.so", target="cuda", arch=arch)
    return relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cuda())["create_kv_cache"]()


@pytest.mark.parametrize("where", ["tirx", "flashinfer", "model library"])
@pytest.mark.parametrize("shape", [SHAPE, LAYERS], ids=["mha", "mha_sliding"])
def test_tree_scripts_match_the_cpu_cache(build_cache, rng, tmp_path, where, shape):
    from attngen.tvm import create_paged_kv_cache

    if where == "model library":
        ours = _model_library_cache(shape, build_cache, tmp_path)
    else:
        ours = create_paged_kv_cache(shape, target="cuda", convention=where, cache=build_cache)
    outs = run_tree_script(_caches(shape, build_cache, ours), shape, tree_script(rng), rng)
    assert all(np.isfinite(x).all() for x in outs["attngen"])
    assert max_err(outs, "attngen", "cpu") < 2e-2


def test_tree_scripts_match_tvms_own_tree_kernels(build_cache, rng):
    import tvm

    from attngen.tvm import create_paged_kv_cache
    from attngen.tvm.baseline import create_tvm_tir_cache_cuda

    caches = {"attngen": (create_paged_kv_cache(SHAPE, target="cuda", cache=build_cache), tvm.cuda(), DTYPE),
              "tvm": (create_tvm_tir_cache_cuda(SHAPE, trees=True), tvm.cuda(), DTYPE)}
    outs = run_tree_script(caches, SHAPE, tree_script(rng), rng)
    assert all(np.isfinite(x).all() for x in outs["attngen"])
    assert max_err(outs, "attngen", "tvm", finite_only=True) < 2e-2
