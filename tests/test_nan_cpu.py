"""NaN and Inf in q, k, v on the CPU backend and the CPU merges follow the float64 reference's rules.

A NaN score poisons its row (O = NaN, lse = NaN), a +inf score too (exp(inf - inf)), a -inf score weighs 0
like a mask, a row with no live key stays O = 0, lse = -inf (told apart from a poisoned one), a non-finite
value makes the columns it enters non-finite, and a masked key's K or V is never read.
"""
import numpy as np
import pytest

from attngen.runtime import CPUAttention, merge_state, merge_states
from attngen.runtime.reference import reference_attention
from attngen.testing import random_params, random_problem
from attngen.variants import builtin

from .nonfinite import compare_nonfinite

HEAD_DIM = 32
_modules = {}


def cpu_module(name, build_cache):
    if name not in _modules:
        v = builtin(name)
        _modules[name] = (v, CPUAttention.build(v, head_dims=(HEAD_DIM,), dtypes=("float32",), cache=build_cache))
    return _modules[name]


def poison(prob, where: str, value: float, rng, *, request: int = 0, key: int = 0):
    """Write ``value`` into one element of q (row of ``request``), or of key / value ``key`` of ``request``,
    in every copy of the problem's KV (ragged, paged, and the reference's per-request arrays)."""
    d = int(rng.integers(HEAD_DIM))
    if where == "q":
        prob.q[int(prob.qo_indptr[request]), 0, d] = value
        return
    half = 0 if where == "k" else 1
    row = int(prob.ragged.indptr[request]) + key
    (prob.ragged.k if half == 0 else prob.ragged.v)[row, :, d] = value
    (prob.keys if half == 0 else prob.values)[request][key, :, d] = value
    page = prob.paged.indices[prob.paged.indptr[request] + key // prob.paged.page_size]
    prob.paged.pages[page, half, key % prob.paged.page_size, :, d] = value


def run_all(att, prob, params=None):
    results = {}
    for name, kv in (("ragged", prob.ragged), ("paged", prob.paged)):
        out = np.full(prob.q.shape, 7.0, np.float32)
        lse = np.full(prob.q.shape[:2], 7.0, np.float32)
        att.prefill(prob.q, kv, prob.qo_indptr, sm_scale=0.25, params=params, out=out, lse=lse)
        results[name] = (out, lse)
    return results


@pytest.mark.parametrize("name", ["vanilla", "causal", "sigmoid"])
@pytest.mark.parametrize("where,value", [("q", np.nan), ("k", np.nan), ("v", np.nan), ("q", np.inf),
                                         ("k", np.inf), ("k", -np.inf), ("v", np.inf), ("v", -np.inf)])
def test_prefill_follows_reference(name, where, value, build_cache, rng):
    v, att = cpu_module(name, build_cache)
    prob = random_problem(rng, [3, 2, 0, 1], [5, 0, 4, 3], 4, 2, HEAD_DIM)
    poison(prob, where, value, rng, request=0, key=1)
    params = random_params(v, rng, prob)
    ref_o, ref_l = reference_attention(v, prob.q, prob.keys, prob.values, prob.qo_indptr, 0.25, params)
    for kind, (out, lse) in run_all(att, prob, params).items():
        compare_nonfinite(out, lse, ref_o, ref_l, tol=1e-4, lse_tol=1e-4, what=f"{name} {kind} {where}={value}")
    if where in "qk" and np.isnan(value) and v.state.value == "softmax":
        assert np.isnan(ref_l).any()  # the poison is visible, not an empty row


def test_nan_key_poisons_row_and_empty_row_stays_empty(build_cache, rng):
    v, att = cpu_module("vanilla", build_cache)
    prob = random_problem(rng, [1, 1], [3, 0], 2, 1, HEAD_DIM)
    poison(prob, "k", np.nan, rng, request=0, key=0)  # the first key: the running max is still -inf
    for kind, (out, lse) in run_all(att, prob).items():
        assert np.isnan(out[0]).all() and np.isnan(lse[0]).all(), kind
        assert (out[1] == 0).all() and np.isneginf(lse[1]).all(), kind


def test_masked_key_is_never_read(build_cache, rng):
    v, att = cpu_module("causal", build_cache)
    prob = random_problem(rng, [2], [6], 2, 1, HEAD_DIM)  # rows at positions 4, 5: key 5 is hidden from row 4
    poison(prob, "k", np.nan, rng, key=5)
    poison(prob, "v", np.inf, rng, key=5)
    ref_o, ref_l = reference_attention(v, prob.q, prob.keys, prob.values, prob.qo_indptr, 0.25)
    assert np.isfinite(ref_o[0]).all() and np.isnan(ref_l[1]).all()
    for kind, (out, lse) in run_all(att, prob).items():
        compare_nonfinite(out, lse, ref_o, ref_l, tol=1e-4, lse_tol=1e-4, what=kind)


def test_decode_nan_and_inf(build_cache, rng):
    v, att = cpu_module("vanilla", build_cache)
    prob = random_problem(rng, [1, 1, 1], [4, 9, 0], 2, 2, HEAD_DIM)
    poison(prob, "k", np.inf, rng, request=0, key=3)
    poison(prob, "v", np.nan, rng, request=1, key=8)
    q = prob.q.copy()
    q[0, 1, 0] = np.nan
    ref_o, ref_l = reference_attention(v, q, prob.keys, prob.values, prob.qo_indptr, 0.25)
    out, lse = att.decode(q, prob.paged, sm_scale=0.25)
    compare_nonfinite(out, lse, ref_o, ref_l, tol=1e-4, lse_tol=1e-4, what="decode")
    assert (out[2] == 0).all() and np.isneginf(lse[2]).all()


def test_merges_keep_poison_and_empty_apart():
    # rows: (finite, empty), (NaN, finite), (empty, NaN), (empty, empty), (NaN, empty)
    lse_a = np.array([[1.0], [np.nan], [-np.inf], [-np.inf], [np.nan]], np.float32)
    lse_b = np.array([[-np.inf], [2.0], [np.nan], [-np.inf], [-np.inf]], np.float32)
    va = np.where(np.isneginf(lse_a)[..., None], 0, np.ones((5, 1, 8))).astype(np.float32)
    vb = np.where(np.isneginf(lse_b)[..., None], 0, 2 * np.ones((5, 1, 8))).astype(np.float32)
    va[np.isnan(lse_a)[:, 0]] = np.nan
    vb[np.isnan(lse_b)[:, 0]] = np.nan
    want_lse = np.array([1.0, np.nan, np.nan, -np.inf, np.nan])
    merged, merged_lse = merge_states(np.stack([va, vb], 1), np.stack([lse_a, lse_b], 1))
    v, s = merge_state(va.copy(), lse_a.copy(), vb, lse_b)
    for o, l in ((merged, merged_lse), (v, s)):
        np.testing.assert_array_equal(l[:, 0], want_lse.astype(np.float32))
        assert (o[0] == 1).all() and (o[3] == 0).all() and np.isnan(o[[1, 2, 4]]).all()


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cache_memory_outside_the_batch_never_reaches_a_row(layout, build_cache, rng):
    """NaN in every page slot no request owns (spare pages, the tails of last pages): results stay finite."""
    v, att = cpu_module("vanilla", build_cache)
    prob = random_problem(rng, [2, 1, 3], [5, 9, 3], 4, 2, HEAD_DIM, layout=layout, spare_pages=3)
    kv = prob.paged
    pages = kv.pages if layout == "NHD" else kv.pages.transpose(0, 1, 3, 2, 4)  # a view: [P, 2, S, H, D]
    used = np.zeros(pages.shape[:1] + pages.shape[2:3], bool)
    for b, n in enumerate(prob.kv_lens):
        for j in range(n):
            used[kv.indices[kv.indptr[b] + j // kv.page_size], j % kv.page_size] = True
    for page, slot in np.argwhere(~used):
        pages[page, :, slot] = np.nan
    ref_o, ref_l = reference_attention(v, prob.q, prob.keys, prob.values, prob.qo_indptr, 0.25)
    out, lse = att.prefill(prob.q, kv, prob.qo_indptr, sm_scale=0.25)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    assert np.abs(out - ref_o).max() < 1e-4
    dec_q = rng.standard_normal((3, 4, HEAD_DIM)).astype(np.float32)
    out, lse = att.decode(dec_q, kv, sm_scale=0.25)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
