"""Bad input to the public runtime API (CPU backend), each met with attngen's own error naming the argument and
the fix, or with the right answer where the input has one: sm_scale, queries without heads, views without tensors,
read-only NumPy arrays, merging no states, cascade levels' row groups, block-sparse ids and sizes, fp8 scales and
appended rows, scalar parameters past float range, requests of 2^29 keys or queries, integer parameters that make hook
arithmetic wrap."""
import numpy as np
import pytest
from tvm.script import tirx as T

from attngen import ScalarParam, Variant, VariantError
from attngen.runtime import (
    AttentionArgumentError,
    BlockSparseView,
    CPUAttention,
    PagedKV,
    RaggedKV,
)
from attngen.runtime.append import append_paged_kv, append_slots
from attngen.runtime.block_sparse import BlockSparseAttention, HeadwiseBlockSparseView
from attngen.runtime.cascade import CascadeAttention, CascadeLevel
from attngen.runtime.fp8 import append_paged_kv_fp8, kv_scales, quantize_kv
from attngen.runtime.params import resolve_params
from attngen.runtime.state import merge_state, merge_states, merge_states_sum
from attngen.testing import random_problem
from attngen.variants import builtin

D = 32


@pytest.fixture(scope="module")
def att(build_cache):
    return CPUAttention.build(builtin("vanilla"), head_dims=(D,), layouts=("NHD",), cache=build_cache)


@pytest.fixture
def prob(rng):
    return random_problem(rng, [3, 2, 1], [5, 6, 4], 4, 2, D)


def _read_only(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x.setflags(write=False)
    return x


# --- sm_scale ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sm_scale, problem", [
    (float("nan"), r"nan is not finite"),
    (float("inf"), r"inf is not finite"),
    (1e39, r"1e\+39 overflows float32"),
    ("0.125", r"expected a number for float32, got str"),
    (10**400, r"the integer given overflows float32"),
])
def test_sm_scale_must_be_a_finite_number(att, prob, sm_scale, problem):
    """Unchecked, a NaN or infinite scale makes every output NaN without a word, and a string or a huge int raises
    Python's own conversion error, naming no argument."""
    with pytest.raises(AttentionArgumentError, match=rf"sm_scale: {problem}.*leave it out for 1/sqrt\(head_dim\)"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr, sm_scale=sm_scale)
    with pytest.raises(AttentionArgumentError, match=rf"sm_scale: {problem}"):
        att.decode(prob.q[:3], prob.paged, sm_scale=sm_scale)


def test_finite_sm_scales_still_run(att, prob):
    """Any finite scale has an answer (zero and negative ones included): the same as the scale folded into q."""
    for scale in (0.0, -0.5, np.float32(0.25)):
        out, _ = att.prefill(prob.q, prob.ragged, prob.qo_indptr, sm_scale=scale)
        folded, _ = att.prefill(prob.q * np.float32(scale), prob.ragged, prob.qo_indptr, sm_scale=1.0)
        assert np.allclose(out, folded, atol=1e-5)


# --- shapes and types the kernels' own checks met first ----------------------------------------------------

def test_a_query_without_heads_is_refused(att, prob):
    """0 is a multiple of every KV head count: unchecked, TVM's argument check refuses q's strides instead."""
    q = np.zeros((3, 0, D), np.float32)
    with pytest.raises(AttentionArgumentError, match=r"q: has no heads \(shape \(3, 0, 32\)\)"):
        att.decode(q, prob.paged)
    with pytest.raises(AttentionArgumentError, match=r"q: has no heads"):
        att.prefill(np.zeros((6, 0, D), np.float32), prob.ragged, prob.qo_indptr)


def test_a_view_without_tensors_is_refused_by_name(att, prob):
    """The views' properties (dtype, page size, heads) are read before the calls' checks: they name the field."""
    p = prob.paged
    no_pages = PagedKV(None, p.indptr, p.indices, p.last_page_len)
    with pytest.raises(AttentionArgumentError, match=r"kv.pages: expected a tensor, got NoneType"):
        att.prefill(prob.q, no_pages, prob.qo_indptr)
    with pytest.raises(AttentionArgumentError, match=r"kv.pages: expected a tensor, got NoneType"):
        att.decode(prob.q[:3], no_pages)
    with pytest.raises(AttentionArgumentError, match=r"kv.pages: expected 5 dims, got shape \(2, 32\)"):
        append_slots(PagedKV(p.pages[0, 0, 0], p.indptr, p.indices, p.last_page_len), np.array([0, 1, 1, 1], np.int32))
    with pytest.raises(AttentionArgumentError, match=r"kv.k: expected a tensor, got list"):
        att.prefill(prob.q, RaggedKV(prob.ragged.k.tolist(), prob.ragged.v, prob.ragged.indptr), prob.qo_indptr)


# --- read-only NumPy arrays --------------------------------------------------------------------------------

def test_read_only_inputs_are_read(att, prob):
    """DLPack cannot export a read-only NumPy array (a BufferError naming nothing); inputs are only read, so they
    serve all the same."""
    want_o, want_l = att.prefill(prob.q, prob.paged, prob.qo_indptr)
    kv = PagedKV(_read_only(prob.paged.pages), _read_only(prob.paged.indptr), _read_only(prob.paged.indices),
                 _read_only(prob.paged.last_page_len))
    out, lse = att.prefill(_read_only(prob.q), kv, _read_only(prob.qo_indptr))
    assert np.array_equal(out, want_o) and np.array_equal(lse, want_l)
    out, lse = att.decode(_read_only(prob.q[:3]), kv)
    assert np.array_equal(out, att.decode(prob.q[:3], prob.paged)[0])


def test_read_only_outputs_are_refused(att, prob):
    out, lse = np.empty_like(prob.q), np.empty(prob.q.shape[:2], np.float32)
    with pytest.raises(AttentionArgumentError, match=r"out: is a read-only NumPy array, and the call writes into it; "
                                                     r"pass a writable array, or leave out= out"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr, out=_read_only(out))
    with pytest.raises(AttentionArgumentError, match=r"lse: is a read-only NumPy array"):
        att.decode(prob.q[:3], prob.paged, lse=_read_only(lse[:3]))
    with pytest.raises(AttentionArgumentError, match=r"kv.pages: is a read-only NumPy array.*written into the cache"):
        kv = PagedKV(_read_only(prob.paged.pages), prob.paged.indptr, prob.paged.indices, prob.paged.last_page_len)
        append_paged_kv(kv, prob.ragged.k[:3], prob.ragged.v[:3], np.array([0, 1, 2, 3], np.int32))


def test_read_only_states_merge(rng):
    v = rng.standard_normal((3, 2, 2, 8)).astype(np.float32)
    s = rng.standard_normal((3, 2, 2)).astype(np.float32)
    want = merge_states(v, s)
    got = merge_states(_read_only(v), _read_only(s))
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert np.array_equal(merge_states_sum(_read_only(v)), merge_states_sum(v))
    with pytest.raises(AttentionArgumentError, match=r"out_lse: is a read-only NumPy array"):
        merge_states(v, s, out_lse=_read_only(np.empty((3, 2), np.float32)))
    (v0, s0), (v1, s1) = ((np.ascontiguousarray(v[:, i]), np.ascontiguousarray(s[:, i])) for i in (0, 1))
    with pytest.raises(AttentionArgumentError, match=r"v: is a read-only NumPy array.*merges in place"):
        merge_state(_read_only(v0), s0, v1, s1)
    merge_state(v0, s0, _read_only(v1), _read_only(s1))  # (the other state is only read)
    mv, ms = v0, s0
    assert np.allclose(mv, want[0], atol=1e-6) and np.allclose(ms, want[1], atol=1e-6)


# --- merging no states -------------------------------------------------------------------------------------

def test_merging_no_states_gives_the_empty_state():
    """K = 0 partial states (TVM's argument check refuses the zero-size tensor's strides): the empty state."""
    out, lse = merge_states(np.zeros((3, 0, 2, 8), np.float32), np.zeros((3, 0, 2), np.float32))
    assert np.array_equal(out, np.zeros((3, 2, 8))) and np.array_equal(lse, np.full((3, 2), -np.inf))
    target = np.full((3, 2, 8), np.nan, np.float32)
    assert merge_states_sum(np.zeros((3, 0, 2, 8), np.float32), out=target) is target
    assert np.array_equal(target, np.zeros((3, 2, 8)))
    with pytest.raises(AttentionArgumentError, match=r"v: dtype float64 is not supported by state merging"):
        merge_states(np.zeros((3, 0, 2, 8)), np.zeros((3, 0, 2), np.float32))


# --- cascade levels ----------------------------------------------------------------------------------------

def _levels(rng):
    """q [6, 4, D] in three requests of 2 rows: a shared level of 2 full pages, then one page of 3 keys each."""
    pages = rng.standard_normal((6, 2, 4, 2, D)).astype(np.float32)
    shared = PagedKV(pages, np.array([0, 2], np.int32), np.array([0, 1], np.int32), np.array([4], np.int32))
    own = PagedKV(pages, np.array([0, 1, 2, 3], np.int32), np.array([2, 3, 4], np.int32),
                  np.array([3, 3, 3], np.int32))
    q = rng.standard_normal((6, 4, D)).astype(np.float32)
    return q, [CascadeLevel(np.array([0, 6], np.int32), shared), CascadeLevel(np.array([0, 2, 4, 6], np.int32), own)]


@pytest.mark.parametrize("mode", ["auto", "flat", "cascade"])
def test_cascade_row_groups_are_checked_in_every_mode(att, rng, mode):
    """A level's qo_indptr is checked whole, by the level's name, in every mode: the flat view ("auto", "flat") cuts
    its row groups from it, and an out-of-order one would give a wrong answer there."""
    cascade = CascadeAttention(att)
    q, levels = _levels(rng)
    cascade.run(q, plan=cascade.plan(levels, 6, D, mode=mode))
    spoilt = {
        "must start at 0 and be non-decreasing": np.array([0, 4, 2, 6], np.int32),
        "expected dtype int32, got int64": np.array([0, 2, 4, 6], np.int64),
        r"expected 1 dims, got shape \(1, 4\)": np.array([[0, 2, 4, 6]], np.int32),
    }
    for problem, qo in spoilt.items():
        bad = [levels[0], CascadeLevel(qo, levels[1].kv)]
        with pytest.raises(AttentionArgumentError, match=rf"levels\[1\].qo_indptr: {problem}"):
            cascade.plan(bad, 6, D, mode=mode)
    with pytest.raises(AttentionArgumentError, match=r"levels\[0\].qo_indptr: needs at least one entry"):
        cascade.plan([CascadeLevel(np.zeros(0, np.int32), levels[0].kv), levels[1]], 6, D, mode=mode)


def test_cascade_arguments_of_another_type_are_named(att, rng):
    cascade = CascadeAttention(att)
    q, levels = _levels(rng)
    with pytest.raises(AttentionArgumentError, match=r"levels\[1\]: expected a CascadeLevel\(qo_indptr, kv\), got "
                                                     r"PagedKV"):
        cascade.plan([levels[0], levels[1].kv], 6, D)
    with pytest.raises(AttentionArgumentError, match=r"levels: expected a list of CascadeLevel, got CascadeLevel"):
        cascade.run(q, levels[0])
    with pytest.raises(AttentionArgumentError, match=r"plan: expected a CascadePlan \(from CascadeAttention.plan\), "
                                                     r"got list"):
        cascade.run(q, plan=levels)
    own = levels[1].kv
    no_pages = CascadeLevel(levels[1].qo_indptr, PagedKV(None, own.indptr, own.indices, own.last_page_len))
    with pytest.raises(AttentionArgumentError, match=r"levels\[1\].kv.pages: expected a tensor, got NoneType"):
        cascade.plan([levels[0], no_pages], 6, D)


# --- block-sparse layouts ----------------------------------------------------------------------------------

def test_block_sparse_ids_must_be_integers(att, rng):
    """Float ids would be truncated (1.7 reading block 1): a wrong answer without a word."""
    pages = rng.standard_normal((3, 2, 4, 2, D)).astype(np.float32)
    q = rng.standard_normal((6, 4, D)).astype(np.float32)
    indptr = np.array([0, 1, 3, 4], np.int32)
    bsa = BlockSparseAttention(att)
    with pytest.raises(AttentionArgumentError, match=r"indices: must hold integers \(an int32 array\), got dtype "
                                                     r"float64"):
        bsa.run(q, pages, BlockSparseView(indptr, np.array([0.0, 0.0, 1.7, 1.0]), 2, 6, 12))
    with pytest.raises(AttentionArgumentError, match=r"indptr: must hold integers"):
        bsa.run(q, pages, BlockSparseView(indptr + 0.5, np.array([0, 0, 2, 1], np.int32), 2, 6, 12))
    with pytest.raises(AttentionArgumentError, match=r"indices\[1\]: must hold integers"):
        HeadwiseBlockSparseView.uniform([indptr, indptr], [np.array([0, 0, 2, 1]), np.array([0, 0, 1.5, 1])],
                                        2, 4, 6, 12)


def test_headwise_block_sizes_must_be_int32_integers():
    """Normalised to int32, float sizes would be truncated and sizes past int32 wrap (2**32 + 4 rows to 4)."""
    mask = np.ones((2, 3, 3), bool)
    cols = np.array([[4, 4, 4]] * 2)
    with pytest.raises(AttentionArgumentError, match=r"block_row_sz\[0\]: must hold integers"):
        HeadwiseBlockSparseView.from_block_mask(mask, np.array([[2, 2, 2.5]] * 2), cols)
    with pytest.raises(AttentionArgumentError, match=r"block_col_sz\[0\]: block sizes must fit int32 \(at most "
                                                     r"2147483647\), got 4294967300"):
        HeadwiseBlockSparseView.from_block_mask(mask, np.array([[2, 2, 2]] * 2), np.array([[4, 4, 2**32 + 4]] * 2))
    view = HeadwiseBlockSparseView([[0], [0]], [[], []], [[], []], [[4], [4]])  # (empty lists: any dtype)
    assert view.num_q_rows == 0


# --- fp8 scales and appended rows --------------------------------------------------------------------------

def test_an_fp8_scale_past_float_range_is_named():
    pages = quantize_kv(np.zeros((2, 2, 4, 1, 8), np.float32), "float8_e4m3fn")
    with pytest.raises(AttentionArgumentError, match=r"k_scale: the integer given overflows float32; scales must be "
                                                     r"finite and positive"):
        kv_scales(10**400, "k_scale", kv_dtype="float8_e4m3fn", num_kv_heads=1, like=pages)


def test_fp8_appends_take_unquantised_float_rows():
    """Rows of another dtype are refused rather than quantised (complex ones would lose their imaginary part, fp8
    ones be scaled twice), and a list is named."""
    pages = quantize_kv(np.zeros((2, 2, 4, 1, 8), np.float32), "float8_e4m3fn")
    rows = np.ones((1, 1, 8), np.float32)
    slots = np.array([3], np.int32)
    for bad, problem in ((rows.astype(np.complex64), "dtype complex64"), (rows.astype(np.int32), "dtype int32"),
                         (quantize_kv(rows, "float8_e4m3fn"), "dtype float8_e4m3fn")):
        with pytest.raises(AttentionArgumentError, match=rf"k: {problem}; append quantises rows of \['float32'"):
            append_paged_kv_fp8(pages, bad, rows, slots, k_scale=1.0, v_scale=1.0)
    with pytest.raises(AttentionArgumentError, match=r"v: expected a tensor, got list"):
        append_paged_kv_fp8(pages, rows, rows.tolist(), slots, k_scale=1.0, v_scale=1.0)
    with pytest.raises(AttentionArgumentError, match=r"pages: is a read-only NumPy array"):
        append_paged_kv_fp8(_read_only(pages), rows, rows, slots, k_scale=1.0, v_scale=1.0)
    append_paged_kv_fp8(pages, rows.astype(np.float16), rows, slots, k_scale=1.0, v_scale=1.0)
    assert pages.astype(np.float32)[0, :, 3].ravel().tolist() == [1.0] * 16


# --- scalar parameters -------------------------------------------------------------------------------------

def test_a_float_parameter_past_float_range_is_named():
    """An int past float64's range makes the float conversion raise OverflowError: the parameter is named."""
    with pytest.raises(AttentionArgumentError, match=r"params\['soft_cap'\]: the integer given overflows float32"):
        resolve_params(builtin("logits_softcap"), {"soft_cap": 10**400}, num_qo_heads=4, batch_size=1)


# --- requests of 2^29 keys or more ------------------------------------------------------------------------

def test_requests_of_2_29_keys_or_queries_are_refused(att):
    """A page table that repeats one page can describe a request of 2^29 keys in little memory; its positions would
    leave the range the hooks' int32 arithmetic is checked for (ir/int_arithmetic.py), so the request is refused
    before any kernel reads it. One key fewer passes the check; a request of 2^29 queries is refused as well (a
    query's position is kv_len - qo_len + i, negative where it has more queries than keys)."""
    page_size = 1 << 16
    pages = np.zeros((1, 2, page_size, 1, D), np.float32)
    n_pages = (1 << 29) // page_size
    indices = np.zeros(n_pages, np.int32)
    q = np.zeros((1, 2, D), np.float32)
    far = PagedKV(pages, np.array([0, n_pages], np.int32), indices, np.array([page_size], np.int32))
    with pytest.raises(AttentionArgumentError, match=r"kv.indptr: a request of 536870912 keys.*fewer than 2\^29"):
        att.decode(q, far)
    from attngen.runtime.checks import check_indptr, check_paged, check_request_lengths
    just_under = PagedKV(pages, far.indptr, indices, np.array([page_size - 1], np.int32))
    assert check_paged(just_under, D, "float32", 1) == 1
    with pytest.raises(AttentionArgumentError, match=r"kv.indptr: a request of 536870912 keys"):
        check_request_lengths(np.array([3, 1 << 29]), "kv.indptr")
    with pytest.raises(AttentionArgumentError, match=r"qo_indptr: a request of 536870912 queries; .*check qo_indptr$"):
        check_indptr(np.array([0, 1 << 29], np.int32), "qo_indptr", None, queries=True)
    assert len(check_indptr(np.array([0, (1 << 29) - 1], np.int32), "qo_indptr", None, queries=True)) == 2


@T.prim_func
def window_plus_one(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                    window: T.int32) -> T.bool:
    return qo_pos - kv_pos < window + 1


@T.prim_func
def window_from_query(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                      window_left: T.int32) -> T.bool:
    return kv_pos <= qo_pos and kv_pos >= qo_pos - window_left


def test_integer_parameters_that_make_hook_arithmetic_wrap_are_refused():
    """``window + 1`` at window = 2^31 - 1 wraps to -2^31 in the kernels (nothing visible) but not in the int64
    reference (everything visible); ``qo_pos - window_left`` wraps at window_left = -2^31, and at 2^31 - 1 for a
    query at a negative position (a request with more queries than keys). Values that keep the terms inside int32
    pass, the extremes included where the term allows them; the built-in window, written on qo_pos - kv_pos, takes
    every value."""
    v = Variant("wrap_window", logits_mask=window_plus_one, params=[ScalarParam("window", "int32", 16)])
    sizes = dict(num_qo_heads=1, batch_size=1)
    with pytest.raises(AttentionArgumentError, match=r"params\['window'\]: with window = 2147483647, hook "
                                                     r"'logits_mask' computes 'window \+ 1' in int32 and it reaches "
                                                     r"2147483648, past the int32 range"):
        resolve_params(v, {"window": 2**31 - 1}, **sizes)
    assert resolve_params(v, {"window": 2**31 - 2}, **sizes) == [2**31 - 2]
    assert resolve_params(v, {"window": -2**31}, **sizes) == [-2**31]
    from_query = Variant("from_query", logits_mask=window_from_query, params=[ScalarParam("window_left", "int32")])
    for w, reach in ((-2**31, 2**31 + 2**29 - 1), (2**31 - 1, -(2**31 - 1) - 2**29 + 1)):
        with pytest.raises(AttentionArgumentError, match=rf"params\['window_left'\]: with window_left = {w}, .*"
                                                         rf"'qo_pos - window_left' .*reaches {reach} for positions "
                                                         r"within \+-2\^29"):
            resolve_params(from_query, {"window_left": w}, **sizes)
    assert resolve_params(from_query, {"window_left": 2**31 - 2**29}, **sizes) == [2**31 - 2**29]
    for w in (-2**31, 2**31 - 1):
        assert resolve_params(builtin("sliding_window_causal"), {"window_left": w}, **sizes) == [w]


@T.prim_func
def wide_window(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                window: T.int64) -> T.bool:
    return qo_pos - kv_pos < T.Cast("int32", window)


def test_int64_parameters_cast_to_int32_are_checked_against_int32():
    """An int64 window cast to int32 is truncated in the kernels (2^40 becomes 0: nothing visible) but not in the
    reference: values past int32 are refused, values inside pass."""
    v = Variant("wide_window", logits_mask=wide_window, params=[ScalarParam("window", "int64", 16)])
    sizes = dict(num_qo_heads=1, batch_size=1)
    with pytest.raises(AttentionArgumentError, match=r"params\['window'\]: with window = 1099511627776, hook "
                                                     r"'logits_mask' casts 'window' to int32 and it reaches "
                                                     r"1099511627776, past the int32 range"):
        resolve_params(v, {"window": 2**40}, **sizes)
    assert resolve_params(v, {"window": 2**31 - 1}, **sizes) == [2**31 - 1]


def test_wrapping_parameters_are_refused_by_the_call(build_cache, prob):
    v = Variant("from_query", logits_mask=window_from_query, params=[ScalarParam("window_left", "int32")])
    att = CPUAttention.build(v, head_dims=(D,), layouts=("NHD",), cache=build_cache)
    with pytest.raises(AttentionArgumentError, match=r"params\['window_left'\]: with window_left = -2147483648"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr, params={"window_left": -2**31})
    out, _ = att.prefill(prob.q, prob.ragged, prob.qo_indptr, params={"window_left": 2**31 - 2**29})
    assert np.isfinite(out).all()


@T.prim_func
def block_causal(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                 chunk: T.int32) -> T.bool:
    return qo_pos // chunk >= kv_pos // (chunk + 0) and T.truncmod(kv_pos, chunk + 1) >= 0


@T.prim_func
def block_causal_guarded(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                         chunk: T.int32) -> T.bool:
    return T.if_then_else(chunk > 0, qo_pos // chunk >= kv_pos // chunk, kv_pos <= qo_pos)


def test_integer_parameters_that_divide_by_zero_are_refused(build_cache, prob):
    """A block-causal mask's ``qo_pos // chunk`` at chunk = 0 stopped the process with SIGFPE on the CPU backend
    (the GPU's division by zero is undefined; the reference's gives 0); a remainder by ``chunk + 1`` at chunk = -1
    the same. Refused per call and when folded; other values run, and 0 where the division sits in a branch of
    T.if_then_else."""
    v = Variant("block_causal", logits_mask=block_causal, params=[ScalarParam("chunk", "int32", 4)])
    sizes = dict(num_qo_heads=1, batch_size=1)
    for chunk, term in ((0, r"qo_pos // chunk"), (-1, r"T.truncmod\(kv_pos, chunk \+ 1\)")):
        with pytest.raises(AttentionArgumentError, match=rf"params\['chunk'\]: with chunk = {chunk}, hook "
                                                         rf"'logits_mask' divides by 0 in '{term}'.*pass a non-zero "
                                                         "value"):
            resolve_params(v, {"chunk": chunk}, **sizes)
    with pytest.raises(VariantError, match=r"with_constants\(chunk=...\): with chunk = 0, hook 'logits_mask' "
                                           r"divides by 0.*Fix: fold a non-zero value"):
        v.with_constants(chunk=0)
    guarded = Variant("block_causal_guarded", logits_mask=block_causal_guarded, params=[ScalarParam("chunk", "int32")])
    assert resolve_params(guarded, {"chunk": 0}, **sizes) == [0]
    att = CPUAttention.build(v, head_dims=(D,), layouts=("NHD",), cache=build_cache)
    with pytest.raises(AttentionArgumentError, match=r"params\['chunk'\]: with chunk = 0, hook 'logits_mask' divides"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr, params={"chunk": 0})
    out, _ = att.prefill(prob.q, prob.ragged, prob.qo_indptr, params={"chunk": 2})
    assert np.isfinite(out).all()
    # the guarded division at chunk = 0 runs its other branch (kv_pos <= qo_pos) in the CPU library
    guarded_att = CPUAttention.build(guarded, head_dims=(D,), layouts=("NHD",), cache=build_cache)
    causal = CPUAttention.build(builtin("causal"), head_dims=(D,), layouts=("NHD",), cache=build_cache)
    out, _ = guarded_att.prefill(prob.q, prob.ragged, prob.qo_indptr, params={"chunk": 0})
    want, _ = causal.prefill(prob.q, prob.ragged, prob.qo_indptr)
    np.testing.assert_allclose(out, want, atol=1e-5)


@T.prim_func
def float_window(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                 width: T.float32) -> T.bool:
    return qo_pos - kv_pos < T.Cast("int32", width * T.float32(2))


def test_float_parameters_whose_integer_cast_overflows_are_refused():
    """A float cast to int32 past its range is INT_MIN on x86, saturated on the GPU and exact in the reference's
    int64: refused per call (inf included); values that fit pass."""
    v = Variant("float_window", logits_mask=float_window, params=[ScalarParam("width", "float32", 8.0)])
    sizes = dict(num_qo_heads=1, batch_size=1)
    for width, shown in ((2e9, "4e\\+09"), (float("inf"), "inf")):
        with pytest.raises(AttentionArgumentError, match=rf"params\['width'\]: with width = {width!r}, hook "
                                                         rf"'logits_mask' casts {shown} to int32 .*cannot hold.*pass a "
                                                         "value whose cast fits int32"):
            resolve_params(v, {"width": width}, **sizes)
    assert resolve_params(v, {"width": 1e9}, **sizes) == [1e9]


def test_queries_at_negative_positions_are_refused_where_a_hook_reads_a_tensor_by_qo_pos(build_cache, rng):
    """A request with more queries than keys puts its first queries at negative positions (kv_len - qo_len + i;
    a decode query of a request without keys at -1): the document mask example's doc_ids[batch, qo_pos] read before the
    tensor's row (garbage on the CPU, out of bounds on the GPU). Refused by name, in prefill and decode; as many
    queries as keys run and match the reference."""
    import runpy
    from pathlib import Path

    from attngen.runtime.reference import reference_attention

    v = runpy.run_path(str(Path(__file__).resolve().parent.parent / "examples" / "document_mask.py"))["variant"]
    att = CPUAttention.build(v, head_dims=(D,), layouts=("NHD",), cache=build_cache)
    over = random_problem(rng, [6], [3], 4, 2, D)
    with pytest.raises(AttentionArgumentError, match=r"qo_indptr: request 0 has 6 queries and 3 keys, so its first "
                                                     r"queries sit at negative positions .*reads params\['doc_ids'\] "
                                                     r"at qo_pos, before the tensor's row"):
        att.prefill(over.q, over.ragged, over.qo_indptr, params={"doc_ids": np.zeros((1, 3), np.int32)})
    decode = random_problem(rng, [1, 1], [3, 0], 4, 2, D)  # a decode query of a request without keys sits at -1
    with pytest.raises(AttentionArgumentError, match=r"kv: request 1 has 1 query and 0 keys, .*give every request at "
                                                     r"least one key"):
        att.decode(decode.q, decode.paged, params={"doc_ids": np.zeros((2, 3), np.int32)})
    fits = random_problem(rng, [3], [3], 4, 2, D)
    ids = np.array([[0, 1, 1]], np.int32)
    out, _ = att.prefill(fits.q, fits.ragged, fits.qo_indptr, params={"doc_ids": ids})
    ref, _ = reference_attention(v, fits.q, fits.keys, fits.values, fits.qo_indptr, 1 / np.sqrt(D),
                                 params={"doc_ids": ids})
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
