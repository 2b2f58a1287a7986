"""Block-sparse (BSR) views through the paged kernels on the CPU backend, against a dense masked reference."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attngen.runtime import AttentionArgumentError, BlockSparseView, CPUAttention
from attngen.variants import builtin

D = 32


@pytest.fixture(scope="module")
def att(tmp_path_factory):
    from attngen.codegen.cache import BuildCache

    return CPUAttention.build(builtin("vanilla"), head_dims=(D,), layouts=("NHD", "HND"),
                              cache=BuildCache(tmp_path_factory.mktemp("c")))


def dense_reference(q, k, v, mask, scale):
    """q [M, Hq, D], k/v [N, Hkv, D], mask [M, N] -> (o, lse base 2) in float64."""
    group = q.shape[1] // k.shape[1]
    kx, vx = np.repeat(k, group, 1).astype(np.float64), np.repeat(v, group, 1).astype(np.float64)
    s = np.einsum("mhd,nhd->hmn", q.astype(np.float64), kx) * scale
    s = np.where(mask[None], s, -np.inf)
    mx = s.max(-1, keepdims=True, initial=-np.inf)
    mx = np.where(np.isfinite(mx), mx, 0)
    p = np.exp(s - mx)
    den = p.sum(-1, keepdims=True)
    o = np.einsum("hmn,nhd->mhd", p / np.where(den > 0, den, 1), vx)
    with np.errstate(divide="ignore"):
        lse = np.where(den[..., 0] > 0, (np.log(den[..., 0]) + mx[..., 0]) / np.log(2), -np.inf).T
    return o, lse


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(1, 4), (4, 4), (3, 8), (16, 2)]), st.integers(1, 40),
       st.integers(1, 50), st.sampled_from(["NHD", "HND"]))
def test_bsr_matches_dense_masked_attention(att, seed, rc, m, n, layout):
    r, c = rc
    rng = np.random.default_rng(seed)
    mb, nb = -(-m // r), -(-n // c)
    blocks = rng.random((mb, nb)) < 0.4
    indptr = np.concatenate([[0], np.cumsum(blocks.sum(1))]).astype(np.int32)
    indices = np.concatenate([np.nonzero(row)[0] for row in blocks] + [np.zeros(0)]).astype(np.int32)
    q = rng.standard_normal((m, 4, D)).astype(np.float32)
    k = rng.standard_normal((nb * c, 2, D)).astype(np.float32)
    v = rng.standard_normal((nb * c, 2, D)).astype(np.float32)
    pages = np.stack([k.reshape(nb, c, 2, D), v.reshape(nb, c, 2, D)], 1)  # page j = key block j
    if layout == "HND":
        pages = np.ascontiguousarray(pages.transpose(0, 1, 3, 2, 4))
    view = BlockSparseView(indptr, indices, r, m, n)
    qo_indptr, kv = view.as_paged(np.ascontiguousarray(pages), layout)
    out = np.full_like(q, np.nan)
    lse = np.full(q.shape[:2], np.nan, np.float32)
    att.prefill(q, kv, qo_indptr, sm_scale=0.3, out=out, lse=lse)
    mask = np.kron(blocks, np.ones((r, c), bool))[:m, :n]
    ref_o, ref_l = dense_reference(q, k[:n], v[:n], mask, 0.3)
    assert np.abs(out - ref_o).max() < 1e-5
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_l))
    live = np.isfinite(ref_l)
    assert np.abs(lse[live] - ref_l[live]).max(initial=0) < 1e-4


def test_bsr_refuses_position_dependent_variants_and_bad_views(tmp_path):
    from attngen.codegen.cache import BuildCache
    from attngen.runtime.views import require_position_free

    with pytest.raises(AttentionArgumentError, match=r"logits_mask reads qo_pos.*flat view"):
        require_position_free(builtin("causal"), "block-sparse rows")
    pages = np.zeros((2, 2, 4, 1, D), np.float32)
    with pytest.raises(AttentionArgumentError, match=r"indices: key block ids must be in \[0, 2\)"):
        BlockSparseView(np.array([0, 1], np.int32), np.array([2], np.int32), 4, 4, 8).as_paged(pages)
    with pytest.raises(AttentionArgumentError, match=r"indptr: has 2 entries, expected ceil\(M/R\) \+ 1 = 3"):
        BlockSparseView(np.array([0, 1], np.int32), np.array([0], np.int32), 4, 5, 8).as_paged(pages)
