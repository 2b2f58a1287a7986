"""Random token-tree scripts (speculative decoding) for TVM's PagedKVCache and a driver that runs caches on any device.

``tree_script`` draws a script: sequences prefilled to random lengths (interleaved, so their pages lie scattered
in the pool), a fork, decode steps, a token-tree step of every sequence (random trees with branching: TVM's ragged
tree slot), the commit of a random accepted path per sequence, another tree step extended before its commit (TVM's
paged tree slot, the tree longer than the step's queries; TVM cannot commit after such a step, so those sequences
are removed), and a last tree step, commit and decode step of the first sequence. ``run_tree_script`` drives caches through it, each on its own device and
dtype, with the same random q / k / v (drawn in the script's dtype), and returns every step's outputs as float64.
test_gpu_tvm_kv_cache_trees.py compares attngen's CUDA caches with attngen's float32 CPU cache (whose tree slots
test_tvm_kv_cache_tree.py checks against a float64 model and TVM's CPU kernels); test_tvm_kv_cache_cuda_trees.py
runs the scripts on the CPU cache.
"""
from __future__ import annotations

import numpy as np


def random_parents(rng, n: int, first: int = 0, before: int = 0) -> list[int]:
    """Parent pointers of ``n`` new tree nodes numbered from ``first`` (nodes ``first - before`` to ``first - 1``
    are the tree's earlier ones): each node's parent an earlier node or -1 (a root), never a chain."""
    parents = []
    for i in range(n):
        node = first + i
        low = first - before
        parents.append(int(rng.integers(low - 1, node)) if node > low else -1)
        if parents[-1] < low:
            parents[-1] = -1
    if n >= 2 and all(p == first + i for i, p in enumerate(parents[1:])):
        parents[1] = parents[0]  # a sibling: TVM treats a chain as an ordinary step
    return parents


def tree_script(rng, n_seqs: int = 3) -> list:
    """A random script (ops as in ``run_tree_script``) over sequences 0 .. n_seqs - 1 and a fork n_seqs."""
    ids = list(range(n_seqs))
    script = [("add", s) for s in ids]
    script.append(("step", ids, [int(x) for x in rng.integers(5, 60, n_seqs)]))
    fork = n_seqs
    script += [("fork", 0, fork, -1), ("step", [fork], [int(rng.integers(2, 9))])]
    ids = ids + [fork]
    script.append(("step", ids, [1] * len(ids)))
    sizes = [int(x) for x in rng.integers(2, 13, len(ids))]
    script.append(("tree", ids, sizes, sum((random_parents(rng, n) for n in sizes), [])))
    script.append(("commit", ids, [int(rng.integers(-1, n)) for n in sizes]))
    script.append(("step", ids, [1] * len(ids)))
    ext = ids[1:]
    first = [int(x) for x in rng.integers(2, 10, len(ext))]
    script.append(("tree", ext, first, sum((random_parents(rng, n) for n in first), [])))
    more = [int(x) for x in rng.integers(1, 6, len(ext))]
    script.append(("tree", ext, more, sum((random_parents(rng, n, f, f) for n, f in zip(more, first)), [])))
    script += [("remove", s) for s in ext]
    last = int(rng.integers(3, 9))
    script += [("tree", [0], [last], random_parents(rng, last)), ("commit", [0], [last - 1]), ("step", [0], [1])]
    return script


def run_tree_script(caches: dict, shape, script, rng) -> dict:
    """Drive every cache (name -> (cache, device, dtype)) through ``script``; name -> per step and layer outputs
    as float64. Ops: ("add", s), ("fork", parent, child, pos), ("remove", s), ("step", ids, lens), ("tree", ids,
    lens, parents), ("commit", ids, leaves)."""
    import tvm
    from tvm.runtime import ShapeTuple

    G = tvm.get_global_func
    hq, hkv, d = shape.num_qo_heads, shape.num_kv_heads, shape.head_dim
    outs = {name: [] for name in caches}
    builtins = {"add": "kv_state_add_sequence", "fork": "kv_state_fork_sequence", "remove": "kv_state_remove_sequence",
                "commit": "attention_kv_cache_commit_accepted_token_tree_nodes"}
    for op, *args in script:
        if op not in ("step", "tree"):
            call = [ShapeTuple(a) for a in args] if op == "commit" else args
            for kv, _, _ in caches.values():
                G(f"vm.builtin.{builtins[op]}")(kv, *call)
            continue
        ids, lens, *tree = args
        n = sum(lens)
        qkvs = [rng.standard_normal((n, hq + 2 * hkv, d)).astype(shape.dtype) for _ in range(shape.num_layers)]
        for name, (kv, dev, dtype) in caches.items():
            G("vm.builtin.kv_state_begin_forward")(kv, ShapeTuple(ids), ShapeTuple(lens),
                                                   *(ShapeTuple(t) for t in tree))
            for layer in range(shape.num_layers):
                out = tvm.runtime.tensor(np.full((n, hq, d), np.nan, dtype), device=dev)
                G("vm.builtin.attention_kv_cache_attention_with_fused_qkv")(
                    kv, layer, d ** -0.5, tvm.runtime.tensor(qkvs[layer].astype(dtype), device=dev), out)
                outs[name].append(out.numpy().astype(np.float64))
            G("vm.builtin.kv_state_end_forward")(kv)
    return outs
