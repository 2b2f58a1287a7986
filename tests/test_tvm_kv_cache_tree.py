"""Token-tree attention (speculative decoding) in TVM's PagedKVCache (CPU) with attngen's tree slots.

- the two tree slots called directly with TVM's argument lists (trees of several shapes, GQA,
  index arrays at byte offsets, a tree extended over two steps so that it is longer than the
  queries): against a float64 reference built from parent pointers, and the ragged slot against
  TVM's own CPU kernel;
- whole caches through prefill, a token-tree step (ragged tree slot), a tree extended without
  commit (paged tree slot), commits of accepted paths, decode, forks: against a cache with TVM's
  kernels and a float64 model of the cache;
- MLA is refused by name.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from tvm.runtime import ShapeTuple

from attngen.tvm import CacheShape, UnsupportedCacheFeature, attention_slot_functions
from attngen.variants import builtin

from .test_tvm_kv_cache import (DTYPE, HKV, HQ, PS, SHAPE, D, G, L, _softcap, assert_close, attend,
                                attngen_cache, kernel_cache, make_cache, max_err, offset_view, tensor,  # noqa: F401
                                tvm_kernels)  # noqa: F401

SM_SCALE = D ** -0.5


def tree_order(parents) -> np.ndarray:
    """TVM's encoding of a tree: per node (DFS order, one past the largest order in its subtree), children
    visited in index order, roots in index order."""
    children: dict[int, list] = {}
    for n, p in enumerate(parents):
        children.setdefault(p, []).append(n)
    out = np.zeros((len(parents), 2), np.int32)
    counter = [0]

    def dfs(n):
        out[n, 0] = counter[0]
        counter[0] += 1
        end = out[n, 0] + 1
        for c in children.get(n, []):
            end = max(end, dfs(c))
        out[n, 1] = end
        return end

    for root in children.get(-1, []):
        dfs(root)
    return out


def ancestors(parents, n) -> set:
    """n and every node above it."""
    seen = set()
    while n != -1:
        seen.add(n)
        n = parents[n]
    return seen


def depths(parents) -> list:
    return [len(ancestors(parents, n)) - 1 for n in range(len(parents))]


def tree_visible(parents, prefix: int, queries: list) -> np.ndarray:
    """bool [len(queries), prefix + len(parents)]: every prefix key, and the query node's ancestors."""
    mask = np.zeros((len(queries), prefix + len(parents)), bool)
    mask[:, :prefix] = True
    for r, n in enumerate(queries):
        for a in ancestors(parents, n):
            mask[r, prefix + a] = True
    return mask


# ---------------------------------------------------------------------------------------------
# the slots alone

TREES = [[-1, 0, 0, 1, 1, 2], [-1, 0, 1], [-1, -1, 0, 1, 2, 0, 3]]  # a tree, a chain, a forest


def _attend_masked(q, k, v, mask, logits=None):
    return attend(q, k, v, np.arange(len(q)), np.arange(len(k)), visible=lambda qp, kp: mask, logits=logits)


def test_ragged_tree_slot_matches_tvm_kernel_and_reference(tvm_kernels, kernel_cache, rng):
    slots = attention_slot_functions(SHAPE, cache=kernel_cache)
    lens = [len(t) for t in TREES]
    indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    n = int(indptr[-1])
    q = rng.standard_normal((n, HQ, D)).astype(DTYPE)
    k = rng.standard_normal((n, HKV, D)).astype(DTYPE)
    v = rng.standard_normal((n, HKV, D)).astype(DTYPE)
    q_pos = np.concatenate([10 * b + np.array(depths(t)) for b, t in enumerate(TREES)]).astype(np.int32)
    order = np.concatenate([tree_order(t) for t in TREES])
    results = {}
    for name, fn in (("tvm", tvm_kernels["tree"]), ("attngen", slots["prefill_tree_mask"])):
        o, lse = tensor(np.full((n, HQ, D), np.nan, DTYPE)), tensor(np.full((n, HQ), np.nan, "float32"))
        fn(tensor(q), offset_view(indptr), tensor(k), tensor(v), offset_view(indptr), offset_view(q_pos),
           offset_view(indptr), offset_view(order), o, lse, 0, 1.0, 1e4, SM_SCALE)
        results[name] = o.numpy(), lse.numpy()
    o, lse = results["attngen"]
    for b, parents in enumerate(TREES):
        rows = slice(indptr[b], indptr[b + 1])
        ref_o, ref_lse = _attend_masked(q[rows], k[rows], v[rows], tree_visible(parents, 0, range(len(parents))))
        assert np.abs(o[rows] - ref_o).max() < 2e-5
        assert np.abs(lse[rows] - ref_lse).max() < 1e-4
    assert np.abs(o - results["tvm"][0]).max() < 1e-5
    assert np.abs(lse - results["tvm"][1]).max() < 1e-4


def _paged_case(rng, requests):
    """Pages holding, per request, a committed prefix then a tree; requests: (prefix, parents, n_queries)."""
    pages, page_indptr, page_indices, last, keys = [], [0], [], [], []
    for prefix, parents, _ in requests:
        total = prefix + len(parents)
        n_pages = -(-total // PS)
        data = rng.standard_normal((n_pages, 2, HKV, PS, D)).astype(DTYPE)
        keys.append((data[:, 0].transpose(0, 2, 1, 3).reshape(-1, HKV, D)[:total],
                     data[:, 1].transpose(0, 2, 1, 3).reshape(-1, HKV, D)[:total]))
        page_indices += list(range(len(pages), len(pages) + n_pages))
        pages += list(data)
        page_indptr.append(len(page_indices))
        last.append(total - (n_pages - 1) * PS)
    perm = rng.permutation(len(pages))  # pages scattered in the pool
    pool = np.stack(pages)[np.argsort(perm)]
    page_indices = [int(perm[i]) for i in page_indices]
    return pool, page_indptr, page_indices, last, keys


def test_paged_tree_slot_matches_reference(kernel_cache, rng):
    """The paged tree slot as TVM calls it when a tree is extended before its nodes are committed: the new
    queries are the tree's last nodes, the tree (longer than the queries) is the chunk's last keys."""
    slots = attention_slot_functions(SHAPE, cache=kernel_cache)
    # (committed prefix, the whole tree's parents, how many of its last nodes are this step's queries)
    requests = [(21, [-1, 0, 0, 1, 1, 2, 3, 6], 2), (0, [-1, 0, 1], 3), (5, [-1, -1, 0, 1, 2, 0, 3], 4),
                (16, [-1, 0], 1)]
    pool, page_indptr, page_indices, last, keys = _paged_case(rng, requests)
    n_q = [nq for *_, nq in requests]
    qo_indptr = np.concatenate([[0], np.cumsum(n_q)]).astype(np.int32)
    tree_indptr = np.concatenate([[0], np.cumsum([len(p) for _, p, _ in requests])]).astype(np.int32)
    order = np.concatenate([tree_order(p) for _, p, _ in requests])
    q = rng.standard_normal((int(qo_indptr[-1]), HQ, D)).astype(DTYPE)
    k_offset = np.array([prefix for prefix, *_ in requests], np.int32)
    q_pos = np.concatenate([prefix + np.array(depths(p))[len(p) - nq:] for prefix, p, nq in requests]).astype(np.int32)
    n = len(q)
    o, lse = tensor(np.full((n, HQ, D), np.nan, DTYPE)), tensor(np.full((n, HQ), np.nan, "float32"))
    slots["prefill_tree_mask_paged"](
        tensor(q), offset_view(qo_indptr), tensor(pool), offset_view(page_indptr), offset_view(page_indices),
        offset_view(last), offset_view(k_offset), offset_view(q_pos), o, lse, 0, 1.0, 1e4, SM_SCALE,
        offset_view(tree_indptr), offset_view(order))
    o, lse = o.numpy(), lse.numpy()
    for b, (prefix, parents, nq) in enumerate(requests):
        rows = slice(qo_indptr[b], qo_indptr[b + 1])
        mask = tree_visible(parents, prefix, range(len(parents) - nq, len(parents)))
        ref_o, ref_lse = _attend_masked(q[rows], *keys[b], mask)
        assert np.abs(o[rows] - ref_o).max() < 2e-5, b
        assert np.abs(lse[rows] - ref_lse).max() < 1e-4, b


def test_paged_tree_slot_on_sliding_layers_reads_either_length_info(kernel_cache, rng):
    """TVM calls the one paged tree slot for "mha" layers (length_info [B]) and "mha_sliding" ones ([3, B]:
    keys from a window offset, the layer window by position); one function serves both."""
    W = 20
    shape = replace(SHAPE, attn_kinds=("mha_sliding", "mha"), sliding_window=W)
    slots = attention_slot_functions(shape, cache=kernel_cache)
    requests = [(30, [-1, 0, 0, 1, 1, 2, 3, 6], 2), (3, [-1, 0, 1], 3)]
    pool, page_indptr, page_indices, last, keys = _paged_case(rng, requests)
    offsets = [5, 0]  # keys dropped at the front of each request's first page (the window's offset)
    n_q = [nq for *_, nq in requests]
    qo_indptr = np.concatenate([[0], np.cumsum(n_q)]).astype(np.int32)
    tree_indptr = np.concatenate([[0], np.cumsum([len(p) for _, p, _ in requests])]).astype(np.int32)
    order = np.concatenate([tree_order(p) for _, p, _ in requests])
    q = rng.standard_normal((int(qo_indptr[-1]), HQ, D)).astype(DTYPE)
    q_pos = np.concatenate([prefix + np.array(depths(p))[len(p) - nq:] for prefix, p, nq in requests]).astype(np.int32)
    for sliding in (False, True):
        length_info = np.array([last, offsets, [0, 0]], np.int32) if sliding else np.array(last, np.int32)
        k_offset = np.array(offsets if sliding else [0, 0], np.int32)
        o, lse = tensor(np.full((len(q), HQ, D), np.nan, DTYPE)), tensor(np.full((len(q), HQ), np.nan, "float32"))
        slots["prefill_tree_mask_paged"](
            tensor(q), offset_view(qo_indptr), tensor(pool), offset_view(page_indptr), offset_view(page_indices),
            offset_view(length_info), offset_view(k_offset), offset_view(q_pos), o, lse, 0, 1.0, 1e4, SM_SCALE,
            offset_view(tree_indptr), offset_view(order))
        o, lse = o.numpy(), lse.numpy()
        for b, (prefix, parents, nq) in enumerate(requests):
            rows = slice(qo_indptr[b], qo_indptr[b + 1])
            drop = offsets[b] if sliding else 0
            mask = tree_visible(parents, prefix, range(len(parents) - nq, len(parents)))[:, drop:]
            if sliding:
                kv_pos = drop + np.arange(mask.shape[1])
                mask &= q_pos[rows][:, None] - kv_pos[None, :] < W
            if sliding and b == 0:
                assert not mask[:, :prefix - drop].all()  # the window hides some of the prefix
            ref_o, ref_lse = _attend_masked(q[rows], keys[b][0][drop:], keys[b][1][drop:], mask)
            assert np.abs(o[rows] - ref_o).max() < 2e-5, (sliding, b)
            assert np.abs(lse[rows] - ref_lse).max() < 1e-4, (sliding, b)


# ---------------------------------------------------------------------------------------------
# whole caches


class TreeReferenceCache:
    """A float64 model of a PagedKVCache with token trees: per sequence and layer the k/v of its committed
    tokens, then the nodes of its uncommitted tree (with their parents)."""

    def __init__(self, logits=None, windows=None):
        self.logits = logits
        self.windows = windows or {}  # layer -> window over the keys cached before a step, by TVM's positions
        self.seqs: dict[int, dict] = {}

    def add(self, s):
        self.seqs[s] = {"k": [np.zeros((0, HKV, D))] * L, "v": [np.zeros((0, HKV, D))] * L, "tree": []}

    def fork(self, parent, child, pos=-1):
        assert not self.seqs[parent]["tree"] and pos == -1
        self.seqs[child] = {key: list(val) for key, val in self.seqs[parent].items()}

    def remove(self, s):
        del self.seqs[s]

    def length(self, s):
        return len(self.seqs[s]["k"][0])

    def commit(self, s, leaf):
        seq = self.seqs[s]
        prefix = self.length(s) - len(seq["tree"])
        keep = sorted(ancestors(seq["tree"], leaf)) if leaf != -1 else []
        rows = list(range(prefix)) + [prefix + n for n in keep]
        seq["k"], seq["v"] = [x[rows] for x in seq["k"]], [x[rows] for x in seq["v"]]
        seq["tree"] = []

    def step(self, ids, lens, parents, qkvs):
        outs = [np.zeros((sum(lens), HQ, D)) for _ in range(L)]
        start = 0
        for s, n in zip(ids, lens):
            seq = self.seqs[s]
            if parents is not None:
                seq["tree"] = seq["tree"] + list(parents[start:start + n])
            for layer in range(L):
                qkv = qkvs[layer][start:start + n].astype(np.float64)
                q, k_new, v_new = qkv[:, :HQ], qkv[:, HQ:HQ + HKV], qkv[:, HQ + HKV:]
                seq["k"][layer] = np.concatenate([seq["k"][layer], k_new])
                seq["v"][layer] = np.concatenate([seq["v"][layer], v_new])
                m = len(seq["k"][layer])
                if seq["tree"]:
                    tree = seq["tree"]
                    mask = tree_visible(tree, m - len(tree), range(len(tree) - n, len(tree)))
                    q_pos = m - len(tree) + np.array(depths(tree))[len(tree) - n:]
                else:
                    mask = np.arange(m)[None, :] <= np.arange(m - n, m)[:, None]
                    q_pos = np.arange(m - n, m)
                if layer in self.windows:  # the committed keys (the tree's and this step's are close)
                    window = self.windows[layer]
                    committed = m - (len(seq["tree"]) or n)
                    mask[:, :committed] &= q_pos[:, None] - np.arange(committed)[None, :] < window
                    if len(seq["tree"]) > n:
                        # a tree extended before its commit: TVM hands the paged tree slot the sequence's last
                        # `window` tokens, the tree's included, while the tree's nodes sit at positions below
                        # their index: keys within the window by position may be missing (docs/tvm.md)
                        mask[:, :max(0, m - window)] = False
                outs[layer][start:start + n] = _attend_masked(q, seq["k"][layer], seq["v"][layer], mask,
                                                              self.logits)[0]
            start += n
        return outs


def run_tree_flow(caches: dict, ref: TreeReferenceCache, script, rng) -> dict:
    outs = {name: [] for name in caches} | {"reference": []}
    for op, *args in script:
        if op in ("step", "tree"):
            ids, lens, *tree = args
            parents = tree[0] if tree else None
            n = sum(lens)
            qkvs = [rng.standard_normal((n, HQ + 2 * HKV, D)).astype(DTYPE) for _ in range(L)]
            for name, kv in caches.items():
                extra = (ShapeTuple(parents),) if parents is not None else ()
                G("vm.builtin.kv_state_begin_forward")(kv, ShapeTuple(ids), ShapeTuple(lens), *extra)
                for layer in range(L):
                    out = tensor(np.full((n, HQ, D), np.nan, DTYPE))
                    G("vm.builtin.attention_kv_cache_attention_with_fused_qkv")(kv, layer, SM_SCALE,
                                                                                 tensor(qkvs[layer]), out)
                    outs[name].append(out.numpy())
                G("vm.builtin.kv_state_end_forward")(kv)
            outs["reference"] += ref.step(ids, lens, parents, qkvs)
        elif op == "commit":
            ids, leaves = args
            for kv in caches.values():
                G("vm.builtin.attention_kv_cache_commit_accepted_token_tree_nodes")(kv, ShapeTuple(ids),
                                                                                     ShapeTuple(leaves))
            for s, leaf in zip(ids, leaves):
                ref.commit(s, leaf)
        else:
            builtin_name = {"add": "add_sequence", "fork": "fork_sequence", "remove": "remove_sequence"}[op]
            for kv in caches.values():
                G(f"vm.builtin.kv_state_{builtin_name}")(kv, *args)
            getattr(ref, op)(*args)
    for kv in caches.values():
        for s in ref.seqs:
            assert G("vm.builtin.attention_kv_cache_get_sequence_length")(kv, s) == ref.length(s)
    return outs


# prefill; a token-tree step of two sequences (ragged tree slot) and the commit of an accepted path in
# each (TVM commits what the last forward appended, in its batch order); decode; a tree extended before
# its commit (paged tree slot; TVM's commit cannot follow such a step, so the sequence is removed); a fork
# whose child drafts a forest, one sequence accepting nothing; decode. (TVM's commit copies the accepted
# nodes only when the batch's last tree is not a chain, so the forest comes last.)
TREE_SCRIPT = [
    ("add", 0), ("add", 1), ("step", [0, 1], [20, 7]),
    ("tree", [0, 1], [6, 3], [-1, 0, 0, 1, 1, 2, -1, 0, 0]),
    ("commit", [0, 1], [4, 2]),
    ("step", [0, 1], [1, 1]),
    ("add", 3), ("step", [3], [18]), ("tree", [3], [6], [-1, 0, 0, 1, 1, 2]), ("tree", [3], [2], [3, 6]),
    ("remove", 3),
    ("fork", 0, 2, -1), ("step", [2], [3]),
    ("tree", [1, 2], [2, 4], [-1, 0, -1, -1, 0, 1]),
    ("commit", [1, 2], [-1, 3]),
    ("step", [0, 1, 2], [1, 1, 1]),
]


def test_vanilla_tree_cache_matches_tvm_kernels_and_reference(tvm_kernels, kernel_cache, rng):
    caches = {"tvm": make_cache(tvm_kernels, tvm_kernels["merge"]), "attngen": attngen_cache(None, kernel_cache)}
    outs = run_tree_flow(caches, TreeReferenceCache(), TREE_SCRIPT, rng)
    assert_close(outs, "attngen", "reference", 2e-5)
    assert_close(outs, "attngen", "tvm", 1e-5)


def test_tree_cache_with_sliding_layer_matches_reference(kernel_cache, rng):
    """A "mha_sliding" layer next to a full one: a tree step and its extension before commit (the paged tree
    slot called with length_info [3, B] on the sliding layer, [B] on the other), the window biting."""
    W = 16
    cache = attngen_cache(None, kernel_cache, attn_kinds=("mha_sliding", "mha"), sliding_window=W)
    script = [("add", 0), ("add", 1), ("step", [0, 1], [14, 5]), ("step", [0, 1], [9, 1]),
              ("tree", [0, 1], [6, 3], [-1, 0, 0, 1, 1, 2, -1, 0, 0]), ("tree", [0, 1], [2, 1], [3, 6, 1])]
    seed = int(rng.integers(1 << 31))
    outs = run_tree_flow({"attngen": cache}, TreeReferenceCache(windows={0: W}), script, np.random.default_rng(seed))
    assert_close(outs, "attngen", "reference", 2e-5)
    unwindowed = run_tree_flow({}, TreeReferenceCache(), script, np.random.default_rng(seed))["reference"]
    assert max_err(outs["attngen"][-2::-L], unwindowed[-2::-L]) > 0.05  # the window bit on layer 0


def test_soft_capped_tree_cache_matches_reference(kernel_cache, rng):
    cache = attngen_cache(builtin("logits_softcap"), kernel_cache, params={"soft_cap": 1.5})
    outs = run_tree_flow({"attngen": cache}, TreeReferenceCache(logits=_softcap(1.5)), TREE_SCRIPT, rng)
    assert_close(outs, "attngen", "reference", 2e-5)


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
def test_an_fp8_cache_is_refused_with_the_reason(fp8):
    """TVM 0.27 would make the forward's q / k / v buffers fp8 too (one dtype for the cache and its buffers)."""
    with pytest.raises(UnsupportedCacheFeature, match=rf"dtype {fp8}: TVM 0.27's PagedKVCache holds its pages "
                                                       r"and its per-forward q / k / v / o buffers in one dtype"):
        replace(SHAPE, dtype=fp8)


def test_mla_is_refused_by_name():
    """TVM itself would create the cache and fail only at the first MLA forward (an empty slot)."""
    with pytest.raises(UnsupportedCacheFeature, match=r"layers \[1\] are 'mla' \(multi-head latent attention\)"):
        replace(SHAPE, attn_kinds=("mha", "mla"))
    with pytest.raises(UnsupportedCacheFeature, match="MLA prefill"):
        CacheShape(num_layers=1, num_qo_heads=4, num_kv_heads=4, head_dim=32, max_batch=1, max_total_tokens=64,
                   prefill_chunk=64, attn_kinds=("MLA",))
