"""GPU: TVM's PagedKVCache on CUDA with attngen's slots applying inline RoPE (RopeMode INLINE, rotary_mode 1).

- the paged and ragged prefill and the decode functions called directly with rotary_mode 1 against a float64
  reference that rotates q at q_rope_position and key j of request b at k_rope_pos_offset[b] + j (TVM's
  rotate-half RoPE, a rope_scale and rope_theta of the call's): pages in random order, requests of odd
  lengths (one without keys), positions that are not the in-call ones (a shared prefix's), causal on and off,
  GQA; outputs poisoned with NaN; the same functions with rotary_mode 0 in that library stay the plain ones;
- the sliding-window prefill and decode with rotary_mode 1 (a library built for a layer window and RoPE);
- whole caches (rope_mode "inline" in the "tirx" convention; per-sequence windows with rope_mode "normal", which
  TVM turns inline; a "mha_sliding" layer next to a full one): prefill then decode steps, pop-n, interleaved
  sequences, against a float64 model of TVM's cache (tests/tvm_window_model.py) and attngen's CPU cache.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from .tvm_window_model import LAYER_SCRIPT, LAYERS, PER_SEQUENCE, SEQUENCE_SCRIPT, SHAPE, CacheModel, attend, \
    max_err, rope, run_script

pytestmark = pytest.mark.gpu

HQ, HKV, D, PS = SHAPE.num_qo_heads, SHAPE.num_kv_heads, SHAPE.head_dim, SHAPE.page_size
SM = D ** -0.5
SCALE, THETA = 0.75, 5e3
WINDOW = 13
KV_LENS = [37, 0, 16, 5, 70]  # keys per request (the paged and decode tests)


@pytest.fixture(scope="module")
def slots(build_cache):
    """window -> the slot functions of a library built for inline RoPE (None: no window)."""
    from attngen.tvm.cuda import cuda_slot_functions
    from attngen.variants import builtin

    return {w: cuda_slot_functions(builtin("vanilla"), head_dim=D, dtype="float16", window=w, rope=True,
                                   cache=build_cache) for w in (None, WINDOW)}


def _cuda(a):
    import torch

    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def _outputs(shape):
    import torch

    return (torch.full(shape, float("nan"), dtype=torch.float16, device="cuda"),
            torch.full(shape[:2], float("nan"), device="cuda"))


def _pages(rng):
    """Pages [P, 2, Hkv, PS, D] in random order, page_indptr, page_indices, last page lengths, per request k / v."""
    n_pages = [(n + PS - 1) // PS for n in KV_LENS]
    total = sum(n_pages) + 2
    pages = rng.standard_normal((total, 2, HKV, PS, D)).astype(np.float16)
    order = rng.permutation(total).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(n_pages)]).astype(np.int32)
    last = np.array([n - (p - 1) * PS if p else 0 for n, p in zip(KV_LENS, n_pages)], np.int32)
    keys = []
    for b, n in enumerate(KV_LENS):
        rows = pages[order[indptr[b]:indptr[b + 1]]].astype(np.float64).transpose(0, 3, 1, 2, 4).reshape(-1, 2, HKV, D)
        keys.append((rows[:n, 0], rows[:n, 1]))
    return pages, order, indptr, last, keys


def _reference(q, q_pos, keys, k_pos0, qo_indptr, causal, window=0, rotary=True):
    """float64 (o, lse) of every request: q and k rotated at TVM's positions (unless not ``rotary``); ``causal``
    by in-call rows as TVM's plain kernels apply it, by positions in the windowed ones (they differ on the shared
    prefix's rows of request 2)."""
    turn = (lambda x, p: rope(x, p, SCALE, THETA)) if rotary else (lambda x, p: x)  # noqa: E731
    outs = []
    for b, (k, v) in enumerate(keys):
        rows = slice(qo_indptr[b], qo_indptr[b + 1])
        kp = k_pos0[b] + np.arange(len(k))
        n, m = rows.stop - rows.start, len(k)
        vis = np.ones((n, m), bool)
        if causal and window:  # the windowed kernels hide keys by TVM's positions
            vis &= kp[None] <= q_pos[rows, None]
        elif causal:  # TVM's causal flag elsewhere: in-call rows, key j visible to row i when j <= m - n + i
            vis &= np.arange(m)[None] <= (m - n + np.arange(n))[:, None]
        if window:
            vis &= q_pos[rows, None] - kp[None] < window
        outs.append(attend(turn(q[rows].astype(np.float64), q_pos[rows]), turn(k, kp), v, vis, SM))
    return np.concatenate([o for o, _ in outs]), np.concatenate([lse for _, lse in outs])


def _check(o, lse, ref):
    import torch

    torch.cuda.synchronize()
    got_o, got_l = o.float().cpu().numpy(), lse.cpu().numpy()
    assert np.isfinite(got_o).all() and np.isfinite(got_l).all()
    assert np.abs(got_o - ref[0]).max() < 2e-2
    assert np.abs(got_l - ref[1]).max() < 2e-2


def _queries(rng, qo_lens, kv_lens):
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    k_pos0 = rng.integers(0, 3000, len(qo_lens)).astype(np.int32)  # large positions: thousands of radians
    q_pos = np.concatenate([k_pos0[b] + kv_lens[b] - n + np.arange(n) for b, n in enumerate(qo_lens)]).astype(np.int32)
    q_pos[qo_indptr[2]:qo_indptr[3]] = k_pos0[2] + kv_lens[2] + 4  # a shared prefix's rows: one later position
    q = rng.standard_normal((qo_indptr[-1], HQ, D)).astype(np.float16)
    return q, qo_indptr, q_pos, k_pos0


@pytest.mark.parametrize("causal", [0, 1])
def test_paged_prefill_with_inline_rope_matches_reference(slots, rng, causal):
    pages, order, indptr, last, keys = _pages(rng)
    q, qo_indptr, q_pos, k_pos0 = _queries(rng, [9, 3, 5, 5, 40], KV_LENS)
    o, lse = _outputs(q.shape)
    slots[None]["prefill"](_cuda(q), _cuda(qo_indptr), _cuda(pages), _cuda(indptr), _cuda(order), _cuda(last),
                           _cuda(k_pos0), _cuda(q_pos), o, lse, causal, 1, SCALE, THETA, SM)
    _check(o, lse, _reference(q, q_pos, keys, k_pos0, qo_indptr, causal))


@pytest.mark.parametrize("causal", [0, 1])
def test_ragged_prefill_with_inline_rope_matches_reference(slots, rng, causal):
    kv_lens = [23, 1, 8, 70]
    k = rng.standard_normal((sum(kv_lens), HKV, D)).astype(np.float16)
    v = rng.standard_normal(k.shape).astype(np.float16)
    kv_indptr = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    keys = [(k[a:b].astype(np.float64), v[a:b].astype(np.float64)) for a, b in zip(kv_indptr[:-1], kv_indptr[1:])]
    q, qo_indptr, q_pos, k_pos0 = _queries(rng, [23, 1, 8, 70], kv_lens)
    o, lse = _outputs(q.shape)
    slots[None]["prefill_ragged"](_cuda(q), _cuda(qo_indptr), _cuda(k), _cuda(v), _cuda(kv_indptr), _cuda(q_pos),
                                  _cuda(k_pos0), o, lse, causal, 1, SCALE, THETA, SM)
    _check(o, lse, _reference(q, q_pos, keys, k_pos0, qo_indptr, causal))


@pytest.mark.parametrize("rotary_mode", [0, 1])  # 0: the library's plain kernels
def test_decode_matches_reference(slots, rng, rotary_mode):
    pages, order, indptr, last, keys = _pages(rng)
    q, qo_indptr, q_pos, k_pos0 = _queries(rng, [1] * len(KV_LENS), KV_LENS)
    o, lse = _outputs(q.shape)
    slots[None]["decode"](_cuda(q), _cuda(pages), _cuda(indptr), _cuda(order), _cuda(last), _cuda(k_pos0),
                          _cuda(q_pos), o, lse, rotary_mode, SCALE, THETA, SM)
    _check(o, lse, _reference(q, q_pos, keys, k_pos0, qo_indptr, False, rotary=rotary_mode == 1))


@pytest.mark.parametrize("causal", [0, 1])
def test_sliding_window_functions_with_inline_rope_match_reference(slots, rng, causal):
    pages, order, indptr, last, keys = _pages(rng)
    length_info = np.stack([last, np.zeros_like(last), np.zeros_like(last)])  # the window view of all the keys
    q, qo_indptr, q_pos, k_pos0 = _queries(rng, [9, 3, 5, 5, 40], KV_LENS)
    o, lse = _outputs(q.shape)
    slots[WINDOW]["prefill_sliding_window"](_cuda(q), _cuda(qo_indptr), _cuda(pages), _cuda(indptr), _cuda(order),
                                            _cuda(length_info), _cuda(k_pos0), _cuda(q_pos), o, lse, causal, 1, SCALE,
                                            THETA, SM)
    _check(o, lse, _reference(q, q_pos, keys, k_pos0, qo_indptr, causal, WINDOW))
    q, qo_indptr, q_pos, k_pos0 = _queries(rng, [1] * len(KV_LENS), KV_LENS)
    o, lse = _outputs(q.shape)
    slots[WINDOW]["decode_sliding_window"](_cuda(q), _cuda(pages), _cuda(indptr), _cuda(order), _cuda(length_info),
                                           _cuda(k_pos0), _cuda(q_pos), o, lse, 1, SCALE, THETA, SM)
    _check(o, lse, _reference(q, q_pos, keys, k_pos0, qo_indptr, False, WINDOW))


# ---------------------------------------------------------------------------------------------
# whole caches

CACHES = {"inline": (replace(SHAPE, rope_mode="inline"), LAYER_SCRIPT),
          "layer window": (replace(LAYERS, rope_mode="inline"), LAYER_SCRIPT),
          "sequence windows": (replace(PER_SEQUENCE, rope_mode="normal"), SEQUENCE_SCRIPT)}


@pytest.mark.parametrize("name", sorted(CACHES))
def test_inline_rope_caches_match_reference_and_cpu_cache(build_cache, rng, name):
    from attngen.tvm import create_paged_kv_cache

    shape, script = CACHES[name]
    shape = replace(shape, rope_scale=SCALE, rope_theta=THETA)
    seed = int(rng.integers(1 << 31))
    ours = create_paged_kv_cache(shape, target="cuda", convention="tirx", cache=build_cache)
    outs = run_script({"attngen": ours}, CacheModel(shape), script, np.random.default_rng(seed))
    cpu = run_script({"cpu": create_paged_kv_cache(shape, cache=build_cache)}, CacheModel(shape), script,
                     np.random.default_rng(seed), device="cpu")
    assert all(np.isfinite(x).all() for x in outs["attngen"])
    assert max_err(outs, "attngen", "reference") < 2e-2
    assert max_err({"attngen": outs["attngen"], "cpu": cpu["cpu"]}, "attngen", "cpu") < 2e-2
