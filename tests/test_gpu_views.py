"""GPU: block-sparse (shared and per-KV-head) and cascade views through the CUDA prefill template and the
CUDA merge kernels."""
import numpy as np
import pytest

from .test_block_sparse import (bsr_of, causal_block_mask, dense_head_mask, dense_reference, random_head_masks,
                                random_sizes)
from .test_cascade import build_case

pytestmark = pytest.mark.gpu
D = 32


def nan_outputs(q):
    """(out like q, lse [rows, Hq] float32) on the GPU, filled with NaN: a row left unwritten fails."""
    import torch

    return torch.full_like(q, float("nan")), torch.full(q.shape[:2], float("nan"), device=q.device)


def written(out, lse):
    """Whether every element of out and lse was written (none is NaN)."""
    return not bool(out.isnan().any()) and not bool(lse.isnan().any())


@pytest.fixture(scope="module")
def cuda_vanilla(build_cache):
    """The plain variant at head_dim 64, float16 (decode for cascade's flat mode, prefill for the rest), built once
    per run in the session's cache that every worker shares (a module fixture runs once per worker)."""
    from attngen.runtime import CUDAAttention
    from attngen.variants import builtin

    return CUDAAttention.build(builtin("vanilla"), head_dims=(64,), dtypes=("float16",), layouts=("NHD",),
                               cache=build_cache)


def test_bsr_on_gpu(cuda_vanilla, rng):
    import torch

    from attngen.runtime import BlockSparseView

    r, c, m, n = 16, 16, 100, 300
    mb, nb = -(-m // r), -(-n // c)
    blocks = rng.random((mb, nb)) < 0.3
    indptr = np.concatenate([[0], np.cumsum(blocks.sum(1))]).astype(np.int32)
    indices = np.concatenate([np.nonzero(row)[0] for row in blocks]).astype(np.int32)
    q = torch.randn(m, 4, 64, dtype=torch.float16, device="cuda")
    pages = torch.randn(nb, 2, c, 2, 64, dtype=torch.float16, device="cuda")
    qo_indptr, kv = BlockSparseView(indptr, indices, r, m, n).as_paged(pages)
    out, lse = nan_outputs(q)
    cuda_vanilla.prefill(q, kv, qo_indptr, sm_scale=0.125, out=out, lse=lse)
    assert written(out, lse)
    k = pages[:, 0].reshape(nb * c, 2, 64)[:n].float().cpu().numpy()
    v = pages[:, 1].reshape(nb * c, 2, 64)[:n].float().cpu().numpy()
    ref, _ = dense_reference(q.float().cpu().numpy(), k, v, np.kron(blocks, np.ones((r, c), bool))[:m, :n], 0.125)
    assert np.abs(out.float().cpu().numpy() - ref).max() < 4e-3


@pytest.mark.parametrize("block_sizes", ["uniform", "variable"])
def test_headwise_bsr_on_gpu(cuda_vanilla, rng, block_sizes):
    """A layout per KV head (one head empty, one empty block row), odd M and N; uniform: 16 x 16 blocks, one key
    block per page; variable: sizes per block and head, keys as one dense page (repacked per head)."""
    import torch

    from attngen.runtime import BlockSparseAttention, HeadwiseBlockSparseView

    n_kv, group, r, c, m, n = 2, 3, 16, 16, 101, 301
    if block_sizes == "uniform":
        blocks = random_head_masks(rng, n_kv, -(-m // r), -(-n // c))
        view = HeadwiseBlockSparseView.uniform(*bsr_of(blocks), r, c, m, n)
        pages = torch.randn(-(-n // c), 2, c, n_kv, 64, dtype=torch.float16, device="cuda")
    else:
        blocks = random_head_masks(rng, n_kv, 6, 9)
        row_sz = np.stack([random_sizes(rng, m, 6) for _ in range(n_kv)])
        col_sz = np.stack([random_sizes(rng, n, 9) for _ in range(n_kv)])
        view = HeadwiseBlockSparseView.from_block_mask(blocks, row_sz, col_sz)
        pages = torch.randn(1, 2, n, n_kv, 64, dtype=torch.float16, device="cuda")
    q = torch.randn(m, n_kv * group, 64, dtype=torch.float16, device="cuda")
    out, lse = nan_outputs(q)
    BlockSparseAttention(cuda_vanilla).run(q, pages, view, sm_scale=0.125, out=out, lse=lse)
    assert written(out, lse)
    k, v = (pages[:, i].reshape(-1, n_kv, 64)[:n].float().cpu().numpy() for i in (0, 1))
    ref_o, ref_l = dense_reference(q.float().cpu().numpy(), k, v, dense_head_mask(view, blocks, group), 0.125)
    out, lse = out.float().cpu().numpy(), lse.cpu().numpy()
    live = np.isfinite(ref_l)
    assert np.abs(out - ref_o).max() < 4e-3
    assert np.array_equal(np.isneginf(lse), ~live) and np.all(out[~live] == 0)
    assert np.abs(lse[live] - ref_l[live]).max() < 2e-3


def cascade_case_on_gpu(rng, rows):
    """test_cascade's two-level case (three requests of ``rows`` query rows each) at head_dim 64 in float16 on
    the GPU: (q, levels, flat view, flat qo_indptr)."""
    import torch

    from attngen.runtime import CascadeLevel, PagedKV

    q, levels, flat, qo_indptr = build_case(rng, [(3, [(rows[0], 9), (rows[1], 5)]), (1, [(rows[2], 7)])])
    dev = lambda a: torch.as_tensor(a).cuda()  # noqa: E731
    pages = torch.as_tensor(levels[0].kv.pages).half().cuda().contiguous()
    pages = torch.nn.functional.pad(pages, (0, 64 - pages.shape[-1])).contiguous()  # head_dim 64 build

    def to_dev(kv):
        return PagedKV(pages, dev(kv.indptr), dev(kv.indices), dev(kv.last_page_len))

    qd = torch.nn.functional.pad(torch.as_tensor(q).half(), (0, 64 - q.shape[-1])).cuda().contiguous()
    return qd, [CascadeLevel(dev(lv.qo_indptr), to_dev(lv.kv)) for lv in levels], to_dev(flat), dev(qo_indptr)


@pytest.mark.parametrize("rows", [[2, 1, 4], [1, 1, 1]])  # prefill-shaped and decode-shaped row groups
def test_cascade_on_gpu(cuda_vanilla, rng, rows):
    """Every mode equals flat prefill: the levels merged ("cascade"), and the concatenated page lists ("flat":
    a prefill, or with one row per request a decode)."""
    import torch

    from attngen.runtime import CascadeAttention

    qd, dev_levels, flat, qo_indptr = cascade_case_on_gpu(rng, rows)
    f_out, f_lse = cuda_vanilla.prefill(qd, flat, qo_indptr, sm_scale=0.25)
    cascade = CascadeAttention(cuda_vanilla)
    for mode in ("cascade", "flat"):
        plan = cascade.plan(dev_levels, qd.shape[0], 64, mode=mode, num_qo_heads=qd.shape[1])
        assert plan.mode == mode
        if mode == "flat":
            assert plan.levels[0].decode == (max(rows) == 1)
        out, lse = nan_outputs(qd)
        cascade.run(qd, plan=plan, sm_scale=0.25, out=out, lse=lse)
        assert written(out, lse), mode
        assert torch.allclose(out.float(), f_out.float(), atol=2e-3)
        assert torch.allclose(lse[torch.isfinite(f_lse)], f_lse[torch.isfinite(f_lse)], atol=1e-3)


@pytest.mark.parametrize("rows", [[2, 1, 4], [1, 1, 1]])
def test_causal_cascade_on_gpu(build_cache, rng, rows):
    """A causal variant's cascade on the CUDA backend: the shared prefixes run on the unmasked sibling library
    (built with the same configuration), the suffixes causally; every mode equals the flat causal prefill."""
    import torch

    from attngen.runtime import CascadeAttention, CUDAAttention
    from attngen.variants import builtin

    att = CUDAAttention.build(builtin("causal"), head_dims=(64,), dtypes=("float16",), layouts=("NHD",),
                              cache=build_cache)
    qd, dev_levels, flat, qo_indptr = cascade_case_on_gpu(rng, rows)
    f_out, f_lse = att.prefill(qd, flat, qo_indptr, sm_scale=0.25)
    cascade = CascadeAttention(att)
    for mode in ("cascade", "flat"):
        plan = cascade.plan(dev_levels, qd.shape[0], 64, mode=mode, num_qo_heads=qd.shape[1])
        out, lse = nan_outputs(qd)
        cascade.run(qd, plan=plan, sm_scale=0.25, out=out, lse=lse)
        torch.cuda.synchronize()
        assert written(out, lse), mode
        assert torch.allclose(out.float(), f_out.float(), atol=2e-3), mode
        assert torch.allclose(lse[torch.isfinite(f_lse)], f_lse[torch.isfinite(f_lse)], atol=1e-3), mode
    assert cascade.unmasked().variant.name == "causal_unmasked"


def test_causal_bsr_on_gpu(build_cache, rng):
    """A causal variant over 16 x 16 blocks (blocks above the diagonal dropped, a partial last block) on the
    CUDA prefill: the block mask and the causal mask together."""
    import torch

    from attngen.runtime import BlockSparseAttention, BlockSparseView, CUDAAttention
    from attngen.variants import builtin

    att = CUDAAttention.build(builtin("causal"), head_dims=(64,), dtypes=("float16",), layouts=("NHD",),
                              cache=build_cache)
    r, m = 16, 200
    mb = -(-m // r)
    blocks = causal_block_mask(rng, mb)
    indptr, indices = bsr_of(blocks[None])
    q = torch.randn(m, 4, 64, dtype=torch.float16, device="cuda")
    pages = torch.randn(mb, 2, r, 2, 64, dtype=torch.float16, device="cuda")
    out, lse = nan_outputs(q)
    BlockSparseAttention(att).run(q, pages, BlockSparseView(indptr[0], indices[0], r, m, m), sm_scale=0.125, out=out,
                                  lse=lse)
    assert written(out, lse)
    k = pages[:, 0].reshape(mb * r, 2, 64)[:m].float().cpu().numpy()
    v = pages[:, 1].reshape(mb * r, 2, 64)[:m].float().cpu().numpy()
    mask = np.kron(blocks, np.ones((r, r), bool))[:m, :m] & np.tri(m, dtype=bool)
    ref, _ = dense_reference(q.float().cpu().numpy(), k, v, mask, 0.125)
    assert np.abs(out.float().cpu().numpy() - ref).max() < 4e-3
