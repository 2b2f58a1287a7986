"""GPU: TVM's PagedKVCache on CUDA with attngen's sliding-window slots.

- the two sliding-window functions called directly against a float64 reference: pages in random order,
  requests of odd lengths (one without keys), length_info [3, B] with sinks and window offsets, TVM's
  positions per query row (one request's rows all at one position, as a fork's shared prefix gives,
  one request's rows among its keys, where causal bites), a library built for a layer window (causal
  on and off) and one for per-sequence windows; outputs poisoned with NaN, rows with no key giving
  lse -5e4;
- whole caches with a "mha_sliding" layer next to a full one (run time in both slot conventions, and
  a model library): prefill chunks longer and shorter than the window, decode steps past it, pop-n,
  interleaved sequences; against a float64 model of TVM's cache and TVM's own CUDA kernels (where those
  give finite rows); then a fork of a prefix longer than the window, whose shared prefix TVM's kernels
  window by in-call rows (so only the float64 model is compared there);
- whole caches with per-sequence windows and attention sinks (StreamingLLM) in both conventions, through
  prefill and decode steps past the windows, against the float64 model and TVM's own CUDA kernels.
"""
from __future__ import annotations

import numpy as np
import pytest

from .tvm_window_model import (FORK_SCRIPT, LAYER_SCRIPT, LAYERS, NO_KEY_LSE, PER_SEQUENCE, SEQUENCE_SCRIPT, SHAPE,
                               WINDOW, CacheModel, attend, max_err, run_script)

pytestmark = pytest.mark.gpu

HQ, HKV, D, PS, DTYPE = SHAPE.num_qo_heads, SHAPE.num_kv_heads, SHAPE.head_dim, SHAPE.page_size, SHAPE.dtype
SM = D ** -0.5


# ---------------------------------------------------------------------------------------------
# the sliding-window functions called directly

# per request: pages, last page length, window offset, sink size (TVM's length_info [3, B] columns)
VIEWS = [(3, 5, 9, 4), (0, 0, 0, 0), (2, 16, 7, 0), (1, 3, 0, 0), (5, 11, 17, 2)]


@pytest.fixture(scope="module")
def slots(build_cache):
    """window -> the slot functions of a library built for it (0: per-sequence windows, WINDOW: a layer window)."""
    from attngen.tvm.cuda import cuda_slot_functions
    from attngen.variants import builtin

    return {w: cuda_slot_functions(builtin("vanilla"), head_dim=D, dtype=DTYPE, window=w, cache=build_cache)
            for w in (0, WINDOW)}


def _views(rng):
    """Pages [P, 2, Hkv, PS, D] in random order, page_indptr, page_indices, length_info [3, B], and per request its
    keys k / v [n, Hkv, D] as float64 (sink rows, then the rows from the window offset on)."""
    total = sum(v[0] for v in VIEWS) + 3
    pages = rng.standard_normal((total, 2, HKV, PS, D)).astype(np.float16)
    order = rng.permutation(total).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum([v[0] for v in VIEWS])]).astype(np.int32)
    length_info = np.array([[v[1] for v in VIEWS], [v[2] for v in VIEWS], [v[3] for v in VIEWS]], np.int32)
    keys = []
    for b, (n_pages, last, offset, sink) in enumerate(VIEWS):
        rows = pages[order[indptr[b]:indptr[b + 1]]].astype(np.float64).transpose(0, 3, 1, 2, 4).reshape(-1, 2, HKV, D)
        n = (n_pages - 1) * PS + last - offset + sink if n_pages else 0
        at = np.array([j if j < sink else j - sink + offset for j in range(n)], np.int64)
        keys.append((rows[at, 0], rows[at, 1]))
    return pages, order, indptr, length_info, keys


def _visible(q_pos, k_pos, window, causal):
    vis = np.ones((len(q_pos), len(k_pos)), bool)
    if window:
        vis &= q_pos[:, None] - k_pos[None, :] < window
    if causal:
        vis &= k_pos[None, :] <= q_pos[:, None]
    return vis


@pytest.mark.parametrize("window", [0, WINDOW])
@pytest.mark.parametrize("causal", [0, 1])
def test_sliding_window_prefill_matches_reference(slots, rng, window, causal):
    import torch

    cuda = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    pages, order, indptr, length_info, keys = _views(rng)
    qo_lens = [5, 2, 9, 4, 3]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    k_pos0 = rng.integers(0, 40, len(VIEWS)).astype(np.int32)
    q_pos = np.zeros(qo_indptr[-1], np.int32)
    for b, n in enumerate(qo_lens):
        after = k_pos0[b] + len(keys[b][0]) + np.arange(n) + int(rng.integers(0, 6))
        q_pos[qo_indptr[b]:qo_indptr[b + 1]] = after
    q_pos[qo_indptr[2]:qo_indptr[3]] = k_pos0[2] + len(keys[2][0]) + 3  # a shared prefix's rows: one position
    q_pos[qo_indptr[4]:qo_indptr[5]] = k_pos0[4] + np.array([20, 41, 59])  # rows among the keys: causal bites
    q = rng.standard_normal((qo_indptr[-1], HQ, D)).astype(np.float16)
    ref_o, ref_l = [], []
    for b in range(len(VIEWS)):
        rows = slice(qo_indptr[b], qo_indptr[b + 1])
        k_pos = k_pos0[b] + np.arange(len(keys[b][0]))
        o, lse = attend(q[rows], *keys[b], _visible(q_pos[rows], k_pos, window, causal), SM)
        ref_o.append(o)
        ref_l.append(lse)
    o = torch.full(q.shape, float("nan"), dtype=torch.float16, device="cuda")
    lse = torch.full(q.shape[:2], float("nan"), device="cuda")
    slots[window]["prefill_sliding_window"](cuda(q), cuda(qo_indptr), cuda(pages), cuda(indptr), cuda(order),
                                            cuda(length_info), cuda(k_pos0), cuda(q_pos), o, lse, causal, 0, 1.0, 1e4,
                                            SM)
    torch.cuda.synchronize()
    got_o, got_l = o.float().cpu().numpy(), lse.cpu().numpy()
    assert np.isfinite(got_o).all() and np.isfinite(got_l).all()
    assert np.abs(got_o - np.concatenate(ref_o)).max() < 2e-2
    assert np.abs(got_l - np.concatenate(ref_l)).max() < 2e-2
    assert (np.concatenate(ref_l)[qo_indptr[1]:qo_indptr[2]] == NO_KEY_LSE).all()  # request 1 has no key


@pytest.mark.parametrize("window", [0, WINDOW])
def test_sliding_window_decode_matches_reference(slots, rng, window):
    import torch

    cuda = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    pages, order, indptr, length_info, keys = _views(rng)
    k_pos0 = rng.integers(0, 40, len(VIEWS)).astype(np.int32)
    # each query just past its keys, or further on (where the layer window hides more of them)
    q_pos = np.array([k_pos0[b] + len(keys[b][0]) - 1 + int(rng.integers(0, 9)) for b in range(len(VIEWS))], np.int32)
    q = rng.standard_normal((len(VIEWS), HQ, D)).astype(np.float16)
    ref = [attend(q[b:b + 1], *keys[b], _visible(q_pos[b:b + 1], k_pos0[b] + np.arange(len(keys[b][0])), window,
                                                 False), SM) for b in range(len(VIEWS))]
    o = torch.full(q.shape, float("nan"), dtype=torch.float16, device="cuda")
    lse = torch.full(q.shape[:2], float("nan"), device="cuda")
    slots[window]["decode_sliding_window"](cuda(q), cuda(pages), cuda(indptr), cuda(order), cuda(length_info),
                                           cuda(k_pos0), cuda(q_pos), o, lse, 0, 1.0, 1e4, SM)
    torch.cuda.synchronize()
    assert np.abs(o.float().cpu().numpy() - np.concatenate([r[0] for r in ref])).max() < 2e-2
    assert np.abs(lse.cpu().numpy() - np.concatenate([r[1] for r in ref])).max() < 2e-2


# ---------------------------------------------------------------------------------------------
# whole caches


def _attngen_cache(shape, build_cache, convention):
    from attngen.tvm import create_paged_kv_cache

    return create_paged_kv_cache(shape, target="cuda", convention=convention, cache=build_cache)


@pytest.mark.parametrize("where", ["tirx", "flashinfer", "model library"])
def test_sliding_window_layers_match_reference_and_tvm(build_cache, rng, tmp_path, where):
    from attngen.tvm.baseline import create_tvm_tir_cache_cuda

    if where == "model library":
        import tvm
        from tvm import relax

        from attngen.runtime.cuda import current_arch
        from attngen.tvm import export_model_library, paged_kv_cache_module

        arch = current_arch()
        mod = paged_kv_cache_module(LAYERS, target="cuda", arch=arch, cache=build_cache)
        path = export_model_library(mod, tmp_path / "model.so", target="cuda", arch=arch)
        ours = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cuda())["create_kv_cache"]()
    else:
        ours = _attngen_cache(LAYERS, build_cache, where)
    outs = run_script({"attngen": ours, "tvm": create_tvm_tir_cache_cuda(LAYERS)}, CacheModel(LAYERS), LAYER_SCRIPT,
                      rng)
    assert all(np.isfinite(x).all() for x in outs["attngen"])
    assert max_err(outs, "attngen", "reference") < 2e-2
    assert max_err(outs, "attngen", "tvm", finite_only=True) < 2e-2  # TVM's kernel: NaN where it masks a whole row
    forked = run_script({"attngen": ours}, CacheModel(LAYERS), FORK_SCRIPT, rng)
    assert all(np.isfinite(x).all() for x in forked["attngen"])
    assert max_err(forked, "attngen", "reference") < 2e-2


@pytest.mark.parametrize("convention", ["tirx", "flashinfer"])
def test_sequence_windows_with_sinks_match_reference_and_tvm(build_cache, rng, convention):
    from attngen.tvm.baseline import create_tvm_tir_cache_cuda

    caches = {"attngen": _attngen_cache(PER_SEQUENCE, build_cache, convention),
              "tvm": create_tvm_tir_cache_cuda(PER_SEQUENCE)}
    outs = run_script(caches, CacheModel(PER_SEQUENCE), SEQUENCE_SCRIPT, rng)
    assert all(np.isfinite(x).all() for x in outs["attngen"])
    assert max_err(outs, "attngen", "reference") < 2e-2
    assert max_err(outs, "attngen", "tvm") < 2e-2
