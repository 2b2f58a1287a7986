"""Cascades and block-sparse views over fp8 caches: ``CascadeAttention.run`` and ``BlockSparseAttention.run`` take
``k_scale`` / ``v_scale`` as ``prefill`` / ``decode`` do, the same for every level; a headwise block-sparse view
gives each KV head's call its own scale. Each run over e4m3 / e5m2 pages (one scale, or one per KV head) equals the
same view over the float32 cache of the dequantised values, which the views' own tests hold to the reference; wrong
scale counts are refused by name. (On the GPU: tests/test_gpu_fp8_views.py.)"""
import numpy as np
import pytest

from attngen.runtime import (BlockSparseAttention, BlockSparseView, CascadeAttention, CascadeLevel, CPUAttention,
                             HeadwiseBlockSparseView, PagedKV)
from attngen.runtime.checks import AttentionArgumentError
from attngen.runtime.fp8 import dequantize_kv, quantize_kv
from attngen.variants import builtin

D, HQ, HKV, PS = 32, 4, 2, 4
_modules = {}


def module(name, kv_dtype, build_cache):
    """``name``'s CPU library over float32 queries and ``kv_dtype`` caches (None: float32 caches)."""
    key = (name, kv_dtype)
    if key not in _modules:
        _modules[key] = CPUAttention.build(builtin(name), head_dims=(D,), dtypes=("float32",),
                                           kv_dtypes=(kv_dtype,) if kv_dtype else (), cache=build_cache)
    return _modules[key]


def fp8_pool(rng, num_pages, kv_dtype, per_head, d=D, pow2=False):
    """(fp8 pages [P, 2, PS, Hkv, d], the float32 pages they hold, k_scale, v_scale); ``pow2``: scales that are
    powers of two (the values held are then exact in 16-bit floats too)."""
    raw = rng.standard_normal((num_pages, 2, PS, HKV, d)).astype(np.float32) * np.float32(3.0)

    def draw(n):
        s = rng.uniform(0.01, 0.05, n)
        return (2.0 ** np.round(np.log2(s)) if pow2 else s).astype(np.float32)
    scales = [draw(HKV) if per_head else float(draw(1)[0]) for _ in range(2)]
    halves = [quantize_kv(np.ascontiguousarray(raw[:, h]), kv_dtype, scales[h]) for h in (0, 1)]
    held = np.stack([dequantize_kv(halves[h], scales[h]) for h in (0, 1)], axis=1).astype(np.float32)
    return np.stack(halves, axis=1), held, scales[0], scales[1]


CASES = [("float8_e4m3fn", False), ("float8_e5m2", True)]


def cascade_levels(pages, device=None):
    """Two requests over ``pages``: shared prefix pages [0, 1]; suffixes [2] (2 keys) and [3, 4] (PS + 3 keys);
    index arrays on ``device`` (None: NumPy)."""
    def arr(*x):
        a = np.array(x, np.int32)
        if device is None:
            return a
        import torch

        return torch.from_numpy(a).to(device)
    shared = PagedKV(pages, arr(0, 2), arr(0, 1), arr(PS))
    unique = PagedKV(pages, arr(0, 1, 3), arr(2, 3, 4), arr(2, 3))
    return [CascadeLevel(arr(0, 5), shared), CascadeLevel(arr(0, 2, 5), unique)]


def bsr_views():
    """A shared and a headwise view over 3 pages of square PS x PS blocks (causal: the diagonal in every row; head
    1 reads fewer blocks than head 0)."""
    shared = BlockSparseView(np.array([0, 1, 3, 6], np.int32), np.array([0, 0, 1, 0, 1, 2], np.int32), PS, 3 * PS,
                             3 * PS)
    headwise = HeadwiseBlockSparseView.uniform([np.array([0, 1, 3, 6]), np.array([0, 1, 2, 4])],
                                               [np.array([0, 0, 1, 0, 1, 2]), np.array([0, 1, 0, 2])],
                                               PS, PS, 3 * PS, 3 * PS)
    return shared, headwise


@pytest.mark.parametrize("kv_dtype,per_head", CASES)
@pytest.mark.parametrize("name", ["vanilla", "causal"])
def test_a_cascade_over_an_fp8_cache_equals_one_over_its_values(name, kv_dtype, per_head, build_cache, rng):
    pages, held, k_scale, v_scale = fp8_pool(rng, 6, kv_dtype, per_head)
    levels = cascade_levels
    q = rng.standard_normal((5, HQ, D)).astype(np.float32)
    fp8, ref = CascadeAttention(module(name, kv_dtype, build_cache)), CascadeAttention(module(name, None, build_cache))
    for mode in ("cascade", "flat"):
        out, lse = fp8.run(q, plan=fp8.plan(levels(pages), 5, D, mode=mode), k_scale=k_scale, v_scale=v_scale)
        ref_o, ref_l = ref.run(q, plan=ref.plan(levels(held), 5, D, mode=mode))
        assert np.abs(out - ref_o).max() < 2e-5 and np.abs(lse - ref_l).max() < 2e-5, mode
    with pytest.raises(AttentionArgumentError, match="k_scale"):
        fp8.run(q, levels(pages), v_scale=v_scale)


@pytest.mark.parametrize("kv_dtype,per_head", CASES)
@pytest.mark.parametrize("name", ["vanilla", "causal"])
def test_block_sparse_views_over_an_fp8_cache_equal_ones_over_its_values(name, kv_dtype, per_head, build_cache,
                                                                         rng):
    pages, held, k_scale, v_scale = fp8_pool(rng, 3, kv_dtype, per_head)
    fp8 = BlockSparseAttention(module(name, kv_dtype, build_cache))
    ref = BlockSparseAttention(module(name, None, build_cache))
    q = rng.standard_normal((3 * PS, HQ, D)).astype(np.float32)
    shared, headwise = bsr_views()
    for view in (shared, headwise):
        out, lse = fp8.run(q, pages, view, k_scale=k_scale, v_scale=v_scale)
        ref_o, ref_l = ref.run(q, held, view)
        assert np.abs(out - ref_o).max() < 2e-5 and np.abs(lse - ref_l).max() < 2e-5, type(view).__name__
    for bad in (np.ones(3, np.float32), np.ones((2, 1), np.float32)):
        with pytest.raises(AttentionArgumentError, match=r"k_scale: shape .* for 2 KV heads"):
            fp8.run(q, pages, headwise, k_scale=bad, v_scale=v_scale)
