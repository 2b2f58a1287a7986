"""TVM's PagedKVCache (CPU) with attngen in its slots, driven through random scripts.

Each script is drawn from a seed: sequences added, forked (whole or at a random position, from parents that may
be forks themselves), popped, and stepped in random batches of prefill, append and decode lengths (several
sequences per forward, empty-cache prefills, single tokens), some sequences with StreamingLLM windows. Every
forward's output of every layer must match the float64 model of the cache (test_tvm_kv_cache.ReferenceCache) and a
cache with TVM's own CPU kernels; at the end each sequence's length agrees with the model. A mismatch names the seed
and the script, which reproduces it. (A longer run of the same, 300 seeds x 30 operations with windows, passed when
this was written.)
"""
from __future__ import annotations

import numpy as np
import pytest

from attngen.variants import builtin

from .test_tvm_kv_cache import (SHAPE, ReferenceCache, Semantics, assert_close, attngen_cache, kernel_cache,  # noqa: F401
                                make_cache, run_flow, tvm_kernels)

MAX_SEQS = 6  # sequences alive at once (the cache's batch holds 8)
MAX_TOKENS = 120  # tokens of one sequence (the cache holds 1024 in all; forks copy their last page at most)
MAX_FORWARD = 200  # tokens of one forward (the prefill chunk is 256)


def random_script(seed: int, ops: int = 14, windows: bool = False) -> list:
    """A valid operation list for run_flow: ("add", s), ("fork", parent, child, pos), ("popn", s, n),
    ("step", ids, lens), and with ``windows`` ("window", s, window, sinks) on the first and half the other added
    sequences (a StreamingLLM window: the cache keeps the sinks and the latest tokens). Popped sequences have no
    forks of their own (TVM refuses to pop shared pages); windowed ones are neither forked nor popped (their kept
    tokens are not a prefix)."""
    rng = np.random.default_rng(seed)
    lengths, children, script, next_id = {}, {}, [], 0
    windowed = set()

    def add():
        nonlocal next_id
        script.append(("add", next_id))
        lengths[next_id], children[next_id] = 0, 0
        if windows and (next_id == 0 or rng.random() < 0.5):  # (the first sequence always)
            script.append(("window", next_id, int(rng.integers(SHAPE.page_size + 2, 48)), int(rng.integers(0, 5))))
            windowed.add(next_id)
        next_id += 1

    add()
    for _ in range(ops):
        kind = rng.choice(["add", "fork", "popn", "step", "step", "step"])
        if kind == "add" and len(lengths) < MAX_SEQS:
            add()
        elif kind == "fork" and len(lengths) < MAX_SEQS:
            parent = int(rng.choice([s for s in lengths if lengths[s] > 0 and s not in windowed] or [-1]))
            if parent < 0:
                continue
            pos = -1 if rng.random() < 0.4 else int(rng.integers(1, lengths[parent] + 1))
            script.append(("fork", parent, next_id, pos))
            lengths[next_id] = lengths[parent] if pos == -1 else pos
            children[next_id], children[parent] = 0, children[parent] + 1
            next_id += 1
        elif kind == "popn":
            free = [s for s in lengths if lengths[s] > 1 and children[s] == 0 and s not in windowed]
            if not free:
                continue
            s = int(rng.choice(free))
            n = int(rng.integers(1, lengths[s]))
            script.append(("popn", s, n))
            lengths[s] -= n
        else:
            pool = [s for s in lengths if lengths[s] < MAX_TOKENS or s in windowed]
            if not pool:
                continue
            ids = [int(s) for s in rng.permutation(pool)[:int(rng.integers(1, len(pool) + 1))]]
            lens, total = [], 0
            for s in ids:
                decode = lengths[s] > 0 and rng.random() < 0.5
                room = 40 if s in windowed else min(40, MAX_TOKENS - lengths[s])  # (a window keeps its size)
                n = 1 if decode else int(rng.integers(1, room + 1))
                n = min(n, MAX_FORWARD - total)
                if n < 1:
                    break
                lens.append(n)
                total += n
            ids = ids[:len(lens)]
            script.append(("step", ids, lens))
            for s, n in zip(ids, lens):
                lengths[s] += n
    return script


SEEDS = range(12)


def test_the_scripts_cover_every_operation():
    """The drawn scripts fork whole and mid-sequence, pop, and step several sequences at once with prefill,
    append and decode lengths (the tests below run exactly these)."""
    ops = [op for seed in SEEDS for op in random_script(seed)]
    forks = [op for op in ops if op[0] == "fork"]
    steps = [op for op in ops if op[0] == "step"]
    assert any(op[3] == -1 for op in forks) and any(op[3] > 0 for op in forks)
    assert any(op[0] == "popn" for op in ops)
    assert any(len(op[1]) > 1 for op in steps)
    lens = [n for op in steps for n in op[2]]
    assert 1 in lens and max(lens) > 16  # decode steps, and appends spanning pages
    windowed = [random_script(200 + seed, windows=True) for seed in SEEDS[:6]]
    assert all(any(op[0] == "window" for op in script) for script in windowed)


def check_script(caches: dict, sem: Semantics, script: list, seed: int) -> None:
    """Run ``script`` through ``caches`` and the model (q / k / v drawn from ``seed``): attngen's outputs match the
    model and, where the caches hold one, TVM's kernels; a mismatch names the script."""
    outs = run_flow(caches, ReferenceCache(sem), script, np.random.default_rng(seed))
    try:
        assert_close(outs, "attngen", "reference", 2e-5)
        if "tvm" in caches:
            assert_close(outs, "attngen", "tvm", 1e-5)
    except AssertionError as e:
        raise AssertionError(f"script {script}: {e}") from e


@pytest.mark.parametrize("seed", SEEDS)
def test_random_scripts_match_the_model_and_tvms_kernels(tvm_kernels, kernel_cache, seed):  # noqa: F811 (fixtures)
    caches = {"tvm": make_cache(tvm_kernels, tvm_kernels["merge"]), "attngen": attngen_cache(None, kernel_cache)}
    check_script(caches, Semantics(), random_script(seed), seed)


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_random_scripts_with_a_variant_match_the_model(kernel_cache, seed):  # noqa: F811 (fixtures)
    """A variant with a scalar parameter (soft-cap) through the same kind of scripts, against the model."""
    cap = 1.5
    sem = Semantics(logits=lambda s, qp, kp: cap * np.tanh(s / cap))
    caches = {"attngen": attngen_cache(builtin("logits_softcap"), kernel_cache, params={"soft_cap": cap})}
    check_script(caches, sem, random_script(100 + seed), seed)


def test_the_cache_shape_holds_the_scripts():
    assert SHAPE.max_batch >= MAX_SEQS and SHAPE.prefill_chunk >= MAX_FORWARD
    assert SHAPE.max_total_tokens >= MAX_SEQS * (MAX_TOKENS + SHAPE.page_size)


@pytest.mark.parametrize("seed", SEEDS[:6])
def test_random_scripts_with_sequence_windows_match_the_model_and_tvms_kernels(tvm_kernels, kernel_cache, seed):  # noqa: F811 (fixtures)
    """Half the sequences keep sinks and a sliding window of their latest tokens (the cache drops the rest),
    beside unwindowed ones that fork and pop, in mixed batches."""
    caches = {"tvm": make_cache(tvm_kernels, tvm_kernels["merge"], support_sliding_window=True),
              "attngen": attngen_cache(None, kernel_cache, support_sliding_window=True)}
    check_script(caches, Semantics(), random_script(200 + seed, windows=True), seed)
