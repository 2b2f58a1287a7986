"""Block-sparse (BSR) views, shared and per KV head, through the paged kernels on the CPU backend, against a
dense masked float64 reference."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attngen.runtime import (AttentionArgumentError, BlockSparseAttention, BlockSparseView, CPUAttention,
                             HeadwiseBlockSparseView)
from attngen.variants import builtin

from .fuzz_engine import stored_pages

D = 32


@pytest.fixture(scope="module")
def att(build_cache):
    # the session's build cache: test_cpu_backend and test_state_merge build this library too
    return CPUAttention.build(builtin("vanilla"), head_dims=(D,), layouts=("NHD", "HND"), cache=build_cache)


@pytest.fixture(scope="module")
def bsa(att):
    return BlockSparseAttention(att)


def dense_reference(q, k, v, mask, scale):
    """q [M, Hq, D], k/v [N, Hkv, D], mask [M, N] or per query head [Hq, M, N] -> (o, lse base 2) in float64."""
    group = q.shape[1] // k.shape[1]
    kx, vx = np.repeat(k, group, 1).astype(np.float64), np.repeat(v, group, 1).astype(np.float64)
    s = np.einsum("mhd,nhd->hmn", q.astype(np.float64), kx) * scale
    s = np.where(mask, s, -np.inf)
    mx = s.max(-1, keepdims=True, initial=-np.inf)
    mx = np.where(np.isfinite(mx), mx, 0)
    p = np.exp(s - mx)
    den = p.sum(-1, keepdims=True)
    o = np.einsum("hmn,nhd->mhd", p / np.where(den > 0, den, 1), vx)
    with np.errstate(divide="ignore"):
        lse = np.where(den[..., 0] > 0, (np.log(den[..., 0]) + mx[..., 0]) / np.log(2), -np.inf).T
    return o, lse


def assert_matches(out, lse, ref_o, ref_l):
    """float32 results against the float64 reference; rows that see no key: O = 0 exactly, lse = -inf."""
    assert np.abs(out - ref_o).max() < 1e-5
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_l))
    live = np.isfinite(ref_l)
    assert np.abs(lse[live] - ref_l[live]).max(initial=0) < 1e-4
    assert np.all(out[~live] == 0)


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
    assert_matches(out, lse, *dense_reference(q, k[:n], v[:n], mask, 0.3))


def test_bsr_refuses_position_dependent_variants_and_bad_views(build_cache):
    from attngen.runtime.views import require_position_free

    with pytest.raises(AttentionArgumentError, match=r"logits_mask reads qo_pos.*flat view"):
        require_position_free(builtin("causal"), "block-sparse rows")
    pages = np.zeros((2, 2, 4, 1, D), np.float32)
    with pytest.raises(AttentionArgumentError, match=r"indices: key block ids must be in \[0, 2\)"):
        BlockSparseView(np.array([0, 1], np.int32), np.array([2], np.int32), 4, 4, 8).as_paged(pages)
    with pytest.raises(AttentionArgumentError, match=r"indptr: has 2 entries, expected ceil\(M/R\) \+ 1 = 3"):
        BlockSparseView(np.array([0, 1], np.int32), np.array([0], np.int32), 4, 5, 8).as_paged(pages)
    for args, msg in (((0, 4, 4), "block_rows: must be an integer of at least 1, got 0"),
                      ((4, -1, 4), "num_q_rows: must be an integer of at least 0, got -1"),
                      ((4.0, 4, 4), "block_rows: must be an integer")):
        with pytest.raises(AttentionArgumentError, match=msg):
            BlockSparseView(np.array([0, 1], np.int32), np.array([0], np.int32), *args)
    view = BlockSparseView(np.array([0, 1, 2], np.int32), np.array([0, 1], np.int32), 1, 2, 8)
    with pytest.raises(AttentionArgumentError, match="layout: 'NDH' is not 'NHD' or 'HND'"):
        view.as_paged(np.zeros((8, 2, 1, 4, D), np.float32), "NDH")
    bsa = BlockSparseAttention(CPUAttention.build(builtin("vanilla"), head_dims=(D,), cache=build_cache))
    with pytest.raises(AttentionArgumentError, match=r"q: shape \(3, 4, 32\), expected \[M, Hq, D\] with M = 2"):
        bsa.run(np.zeros((3, 4, D), np.float32), np.zeros((8, 2, 4, 1, D), np.float32), view)


def random_head_masks(rng, n_kv: int, mb: int, nb: int) -> np.ndarray:
    """[Hkv, MB, NB] block masks; head 0 reads no block, block row MB // 2 of head 1 reads none."""
    blocks = rng.random((n_kv, mb, nb)) < 0.4
    blocks[0] = False
    blocks[1, mb // 2] = False
    return blocks


def bsr_of(blocks: np.ndarray) -> tuple[list, list]:
    """Per-head (indptr [MB+1], indices [nnz]) of [Hkv, MB, NB] block masks."""
    return ([np.concatenate([[0], np.cumsum(b.sum(1))]).astype(np.int32) for b in blocks],
            [np.nonzero(b)[1].astype(np.int32) for b in blocks])


def dense_head_mask(view, blocks: np.ndarray, group: int) -> np.ndarray:
    """[Hq, M, N] visibility of a headwise view built from block masks ``blocks`` [Hkv, MB, NB]."""
    mask = np.stack([np.repeat(np.repeat(b, r, 0), c, 1)
                     for b, r, c in zip(blocks, view.block_row_sz, view.block_col_sz)])  # [Hkv, M, N]
    return np.repeat(mask, group, 0)


def run_headwise(bsa, rng, view, blocks, group: int, page_size: int | None, layout: str):
    """Run ``view`` over random q, k, v; compare with the dense reference of its per-head block masks."""
    m, n, n_kv = view.num_q_rows, view.num_kv_rows, view.num_kv_heads
    q = rng.standard_normal((m, n_kv * group, D)).astype(np.float32)
    k, v = rng.standard_normal((2, n, n_kv, D)).astype(np.float32)
    out, lse = np.full_like(q, np.nan), np.full(q.shape[:2], np.nan, np.float32)
    bsa.run(q, stored_pages(k, v, page_size or n, layout, spare=1), view, layout=layout, sm_scale=0.3,
            out=out, lse=lse)
    assert_matches(out, lse, *dense_reference(q, k, v, dense_head_mask(view, blocks, group), 0.3))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(1, 4), (4, 4), (3, 8), (16, 2)]), st.integers(1, 40),
       st.integers(1, 50), st.sampled_from([(2, 2), (3, 2), (2, 4)]), st.sampled_from(["NHD", "HND"]))
def test_headwise_bsr_matches_dense_masked_attention(bsa, seed, rc, m, n, heads, layout):
    """Fixed R x C blocks, a layout per KV head, keys paged one key block per page (no repacking)."""
    (r, c), (n_kv, group) = rc, heads
    rng = np.random.default_rng(seed)
    blocks = random_head_masks(rng, n_kv, -(-m // r), -(-n // c))
    view = HeadwiseBlockSparseView.uniform(*bsr_of(blocks), r, c, m, n)
    run_headwise(bsa, rng, view, blocks, group, c, layout)


def random_sizes(rng, total: int, n_blocks: int) -> np.ndarray:
    """[n_blocks] positive block sizes summing to ``total`` (n_blocks <= total)."""
    cuts = np.sort(rng.choice(np.arange(1, total), n_blocks - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int32)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 40), st.integers(1, 50), st.sampled_from([1, 3, 4, None]),
       st.sampled_from(["NHD", "HND"]))
def test_variable_block_sizes_per_head(bsa, seed, m, n, page_size, layout):
    """FlashInfer's variable form: block sizes vary per block and per head; keys stored in pages of another
    size (None: dense k, v as one page), so most heads are repacked."""
    rng = np.random.default_rng(seed)
    n_kv, mb, nb = 3, int(rng.integers(1, min(m, 6) + 1)), int(rng.integers(1, min(n, 6) + 1))
    row_sz = np.stack([random_sizes(rng, m, mb) for _ in range(n_kv)])
    col_sz = np.stack([random_sizes(rng, n, nb) for _ in range(n_kv)])
    blocks = random_head_masks(rng, n_kv, mb, nb)
    run_headwise(bsa, rng, HeadwiseBlockSparseView.from_block_mask(blocks, row_sz, col_sz), blocks, 2, page_size,
                 layout)


def test_shared_layout_runs_the_same_both_ways(att, bsa, rng):
    """A BlockSparseView through BlockSparseAttention is one prefill call; the headwise view with that layout
    on every head gives the same result."""
    r, c, m, n, n_kv = 4, 4, 13, 18, 2
    blocks = rng.random((-(-m // r), -(-n // c))) < 0.5
    blocks[1] = False
    indptr, indices = bsr_of(blocks[None])
    q = rng.standard_normal((m, 2 * n_kv, D)).astype(np.float32)
    pages = stored_pages(*rng.standard_normal((2, n, n_kv, D)).astype(np.float32), c, "NHD")
    shared = BlockSparseView(indptr[0], indices[0], r, m, n)
    out, lse = bsa.run(q, pages, shared, sm_scale=0.3)
    qo_indptr, kv = shared.as_paged(pages)
    ref = att.prefill(q, kv, qo_indptr, sm_scale=0.3)
    headwise = bsa.run(q, pages, HeadwiseBlockSparseView.uniform(indptr * n_kv, indices * n_kv, r, c, m, n),
                       sm_scale=0.3)
    for a, b, h in zip((out, lse), ref, headwise):
        assert np.array_equal(a, b)
        np.testing.assert_allclose(h, a, atol=1e-6)


def test_headwise_refuses_position_and_head_dependent_variants():
    from types import SimpleNamespace

    with pytest.raises(AttentionArgumentError, match=r"logits_mask reads qo_pos.*flat view"):
        BlockSparseAttention(SimpleNamespace(variant=builtin("sliding_window_causal")))
    view = HeadwiseBlockSparseView.uniform([[0, 1]], [[0]], 4, 4, 4, 4)
    with pytest.raises(AttentionArgumentError, match=r"output_transform reads qo_head.*shared-layout BlockSparseView"):
        BlockSparseAttention(SimpleNamespace(variant=builtin("attention_sink"))).run(
            np.zeros((4, 1, D), np.float32), np.zeros((1, 2, 4, 1, D), np.float32), view)


def test_headwise_view_errors_name_the_argument(bsa):
    ok = ([[0, 1, 1], [0, 0, 1]], [[0], [1]])
    uniform = HeadwiseBlockSparseView.uniform
    with pytest.raises(AttentionArgumentError, match=r"counts .*'indices': 1.* one array per KV head"):
        uniform(ok[0], ok[1][:1], 4, 4, 5, 8)
    with pytest.raises(AttentionArgumentError, match=r"indptr: expected one 1-D array per KV head"):
        uniform(np.array([0, 1, 1], np.int32), ok[1], 4, 4, 5, 8)
    with pytest.raises(AttentionArgumentError, match=r"indices\[1\]: key block ids must be in \[0, 2\), got 2"):
        uniform(ok[0], [[0], [2]], 4, 4, 5, 8)
    with pytest.raises(AttentionArgumentError, match=r"indptr\[0\]: has 3 entries, expected ceil\(M/R\) \+ 1 = 2"):
        uniform(*ok, 8, 4, 5, 8)
    with pytest.raises(AttentionArgumentError, match=r"block_cols: must be a positive int, got 0"):
        uniform(*ok, 4, 0, 5, 8)
    with pytest.raises(AttentionArgumentError, match=r"indices\[0\]: block row 0 lists key blocks out of order"):
        uniform([[0, 2, 2], [0, 0, 0]], [[1, 0], []], 4, 4, 5, 8)
    mask = np.ones((2, 2, 2), bool)
    with pytest.raises(AttentionArgumentError, match=r"block_row_sz: shape \(2, 3\), expected \(2, 2\)"):
        HeadwiseBlockSparseView.from_block_mask(mask, np.ones((2, 3), np.int32), np.ones((2, 2), np.int32))
    with pytest.raises(AttentionArgumentError, match=r"block_row_sz\[1\]: its blocks cover 5 query rows but "
                                                     r"block_row_sz\[0\]'s cover 4"):
        HeadwiseBlockSparseView.from_block_mask(mask, [[2, 2], [2, 3]], [[4, 4], [4, 4]])
    with pytest.raises(AttentionArgumentError, match=r"block_col_sz\[0\]: block sizes must be >= 1, got 0"):
        HeadwiseBlockSparseView.from_block_mask(mask, [[2, 2], [2, 2]], [[8, 0], [4, 4]])
    view = uniform(*ok, 4, 4, 5, 8)
    q, pages = np.zeros((5, 4, D), np.float32), np.zeros((2, 2, 4, 2, D), np.float32)
    with pytest.raises(AttentionArgumentError, match=r"pages: holds 3 KV heads but the view has layouts for 2"):
        bsa.run(q, np.zeros((2, 2, 4, 3, D), np.float32), view)
    with pytest.raises(AttentionArgumentError, match=r"pages: holds 4 key rows \(1 pages of 4\), the view's key "
                                                     "blocks cover 8"):
        bsa.run(q, pages[:1], view)
    with pytest.raises(AttentionArgumentError, match=r"q: shape \(4, 4, 32\), expected \[M, Hq, D\] with M = 5"):
        bsa.run(q[:4], pages, view)
    with pytest.raises(AttentionArgumentError, match=r"q: 3 heads is not a multiple of the 2 KV heads"):
        bsa.run(q[:, :3], pages, view)


@pytest.fixture(scope="module")
def causal_bsa(build_cache):
    return BlockSparseAttention(CPUAttention.build(builtin("causal"), head_dims=(D,), layouts=("NHD", "HND"),
                                                   cache=build_cache))


def causal_block_mask(rng, mb: int) -> np.ndarray:
    """[MB, MB] block mask: random blocks on and below the diagonal, the diagonal in most rows that read any
    (the others see only earlier blocks, wholly), some rows reading none, and blocks above the diagonal (which a
    causal mask hides whole)."""
    blocks = rng.random((mb, mb)) < 0.4
    reads = rng.random(mb) < 0.85
    blocks[np.arange(mb), np.arange(mb)] = reads & (rng.random(mb) < 0.7)
    blocks[~reads] = False
    return blocks


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([1, 4, 8]), st.integers(1, 40), st.sampled_from(["NHD", "HND"]))
def test_causal_bsr_matches_dense_causal_masked_attention(causal_bsa, seed, r, m, layout):
    """A causal variant over R x R blocks of M = N rows: the block mask and the causal mask together (query i at
    key i), blocks above the diagonal dropped, a partial last block; rows reading no block get O = 0."""
    rng = np.random.default_rng(seed)
    mb = -(-m // r)
    blocks = causal_block_mask(rng, mb)
    indptr, indices = bsr_of(blocks[None])
    q = rng.standard_normal((m, 4, D)).astype(np.float32)
    k, v = rng.standard_normal((2, m, 2, D)).astype(np.float32)
    out, lse = np.full_like(q, np.nan), np.full(q.shape[:2], np.nan, np.float32)
    causal_bsa.run(q, stored_pages(k, v, r, layout), BlockSparseView(indptr[0], indices[0], r, m, m), layout=layout,
                   sm_scale=0.3, out=out, lse=lse)
    mask = np.kron(blocks, np.ones((r, r), bool))[:m, :m] & np.tri(m, dtype=bool)
    assert_matches(out, lse, *dense_reference(q, k, v, mask, 0.3))


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 30))
def test_causal_headwise_bsr_with_variable_square_blocks(causal_bsa, seed, m):
    rng = np.random.default_rng(seed)
    n_kv, mb = 2, int(rng.integers(1, min(m, 6) + 1))
    sizes = np.stack([random_sizes(rng, m, mb) for _ in range(n_kv)])
    blocks = np.stack([causal_block_mask(rng, mb) for _ in range(n_kv)])
    view = HeadwiseBlockSparseView.from_block_mask(blocks, sizes, sizes)
    q = rng.standard_normal((m, n_kv * 2, D)).astype(np.float32)
    k, v = rng.standard_normal((2, m, n_kv, D)).astype(np.float32)
    out, lse = np.full_like(q, np.nan), np.full(q.shape[:2], np.nan, np.float32)
    causal_bsa.run(q, stored_pages(k, v, m, "NHD"), view, sm_scale=0.3, out=out, lse=lse)
    mask = dense_head_mask(view, blocks, 2) & np.tri(m, dtype=bool)[None]
    assert_matches(out, lse, *dense_reference(q, k, v, mask, 0.3))


def test_causal_bsr_refuses_blocks_off_the_diagonal_square(causal_bsa, rng):
    q = np.zeros((8, 2, D), np.float32)
    pages = np.zeros((4, 2, 2, 1, D), np.float32)  # key blocks of 2 rows
    with pytest.raises(AttentionArgumentError, match="square blocks on the diagonal"):
        causal_bsa.run(q, pages, BlockSparseView(np.array([0, 1, 2], np.int32), np.array([0, 1], np.int32), 4, 8, 8))


def test_a_row_without_its_diagonal_block_sees_its_earlier_blocks_whole(causal_bsa, rng):
    """Block row 1 reads only block 0: its rows see all of block 0 (run on the variant without the mask), while
    row 0 runs causally; the unmasked sibling library is built on first need."""
    q = rng.standard_normal((8, 2, D)).astype(np.float32)
    k, v = rng.standard_normal((2, 8, 1, D)).astype(np.float32)
    out, lse = causal_bsa.run(q, stored_pages(k, v, 4, "NHD"),
                              BlockSparseView(np.array([0, 1, 2], np.int32), np.array([0, 0], np.int32), 4, 8, 8),
                              sm_scale=0.3)
    mask = np.zeros((8, 8), bool)
    mask[:4, :4] = np.tri(4, dtype=bool)
    mask[4:, :4] = True
    assert_matches(out, lse, *dense_reference(q, k, v, mask, 0.3))
    assert causal_bsa.unmasked().variant.name == "causal_unmasked"


def test_causal_blocks_name_the_first_block_that_is_not_square():
    from attngen.runtime.views import causal_blocks

    ip, ix = np.arange(7, dtype=np.int32), np.arange(6, dtype=np.int32)
    with pytest.raises(AttentionArgumentError, match="block row 4 of 2 rows and key block 4 of 1"):
        causal_blocks(ip, ix, [1, 1, 1, 1, 2, 1], [1, 1, 1, 1, 1, 2])
