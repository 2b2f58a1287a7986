"""Argument checks before any launch: each names the argument and the fix."""
import numpy as np
import pytest

from attngen.runtime import AttentionArgumentError, CPUAttention, PagedKV, RaggedKV
from attngen.testing import random_problem
from attngen.variants import builtin

D = 32


@pytest.fixture(scope="module")
def att(build_cache):
    # NHD only: test_configuration_not_built asks for the HND function this library lacks
    return CPUAttention.build(builtin("alibi"), head_dims=(D,), dtypes=("float32",), layouts=("NHD",),
                              cache=build_cache)


@pytest.fixture
def prob(rng):
    return random_problem(rng, [3, 2], [5, 6], 4, 2, D)


def _params(n=4):
    return {"alibi_slopes": np.ones(n, np.float32)}


def test_page_index_past_the_cache(att, prob):
    bad = prob.paged.indices.copy()
    bad[0] = prob.paged.pages.shape[0]
    kv = PagedKV(prob.paged.pages, prob.paged.indptr, bad, prob.paged.last_page_len)
    with pytest.raises(AttentionArgumentError, match=r"kv.indices: page id .* outside the cache's"):
        att.prefill(prob.q, kv, prob.qo_indptr, params=_params())


def test_last_page_len_out_of_range(att, prob):
    kv = PagedKV(prob.paged.pages, prob.paged.indptr, prob.paged.indices, np.array([5, 1], np.int32))
    with pytest.raises(AttentionArgumentError, match=r"kv.last_page_len: must be in \[1, page_size=4\]"):
        att.prefill(prob.q, kv, prob.qo_indptr, params=_params())


def test_wrong_dtype_and_shape(att, prob):
    with pytest.raises(AttentionArgumentError, match=r"kv.k: expected dtype float32, got float64"):
        att.prefill(prob.q, RaggedKV(prob.ragged.k.astype(np.float64), prob.ragged.v, prob.ragged.indptr),
                    prob.qo_indptr, params=_params())
    with pytest.raises(AttentionArgumentError, match=r"qo_indptr: expected dtype int32"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr.astype(np.int64), params=_params())
    with pytest.raises(AttentionArgumentError, match=r"out: shape"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr, params=_params(), out=np.empty((1, 4, D), np.float32))


def test_indptr_inconsistent(att, prob):
    with pytest.raises(AttentionArgumentError, match=r"qo_indptr: last entry is 4 but the data holds 5 rows"):
        att.prefill(prob.q, prob.ragged, np.array([0, 3, 4], np.int32), params=_params())
    with pytest.raises(AttentionArgumentError, match=r"non-decreasing"):
        att.prefill(prob.q, prob.ragged, np.array([0, 6, 5], np.int32), params=_params())
    with pytest.raises(AttentionArgumentError, match=r"kv.indptr: has 2 entries, expected batch_size \+ 1 = 3"):
        att.prefill(prob.q, RaggedKV(prob.ragged.k, prob.ragged.v, np.array([0, 11], np.int32)),
                    prob.qo_indptr, params=_params())


def test_gqa_ratio_must_divide(att, rng):
    p = random_problem(rng, [2], [3], 3, 2, D)
    with pytest.raises(AttentionArgumentError, match=r"num_qo_heads must be a multiple of num_kv_heads"):
        att.prefill(p.q, p.ragged, p.qo_indptr, params=_params(3))


def test_params_missing_unknown_or_wrong_size(att, prob):
    with pytest.raises(AttentionArgumentError, match=r"params\['alibi_slopes'\]: variant 'alibi' needs it"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr)
    with pytest.raises(AttentionArgumentError, match=r"\['soft_cap'\] are not parameters of variant 'alibi'"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr, params={**_params(), "soft_cap": 1.0})
    with pytest.raises(AttentionArgumentError, match=r"dim 0 \(num_qo_heads\) is 3, expected 4"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr, params=_params(3))


def test_configuration_not_built(att, prob, rng):
    p = random_problem(rng, [2], [3], 4, 2, 64)
    with pytest.raises(AttentionArgumentError, match=r"q: head_dim is 64, this module was built for 32|has no"):
        att.prefill(p.q, p.ragged, p.qo_indptr, params=_params())
    hnd = random_problem(rng, [2], [3], 4, 2, D, layout="HND")
    with pytest.raises(AttentionArgumentError, match=r"has no batch_prefill_paged_hnd_f32_d32"):
        att.prefill(hnd.q, hnd.paged, hnd.qo_indptr, params=_params())


def test_non_contiguous_input(att, prob):
    """The CPU backend packs a query of any layout itself (same result); the checks the CUDA backend runs refuse
    a layout its kernels cannot read in place, by name."""
    from attngen.runtime.checks import check_tensor

    q = np.asfortranarray(prob.q)
    out, lse = att.prefill(q, prob.ragged, prob.qo_indptr, params=_params())
    ref_o, ref_l = att.prefill(prob.q, prob.ragged, prob.qo_indptr, params=_params())
    assert np.array_equal(out, ref_o) and np.array_equal(lse, ref_l, equal_nan=True)
    with pytest.raises(AttentionArgumentError, match=r"q: must be contiguous"):
        check_tensor(q, "q", 3, strided="tokens")


def test_page_table_may_have_spare_capacity():
    """kv.indices may be longer than kv.indptr[-1] (a fixed-size, graph-captured page table); only the used
    entries are range-checked, and indptr may not run past the buffer."""
    from attngen.runtime.checks import check_paged

    pages = np.zeros((4, 2, 16, 1, 64), np.float32)
    spare = np.array([0, 3, 99, -5], np.int32)  # the last two are unused garbage
    kv = PagedKV(pages, np.array([0, 1, 2], np.int32), spare, np.array([16, 3], np.int32))
    assert check_paged(kv, 64, "float32", 2) == 2
    kv = PagedKV(pages, np.array([0, 1, 5], np.int32), spare, np.array([16, 3], np.int32))
    with pytest.raises(AttentionArgumentError, match=r"kv.indptr: last entry is 5 but the indexed buffer holds only 4"):
        check_paged(kv, 64, "float32", 2)
