"""GPU: cascades and block-sparse views over fp8 caches (tests/test_fp8_views.py's cases on the CUDA templates):
float16 queries over e4m3 / e5m2 pages at power-of-two scales equal the same views over the float16 cache of the
values the pages hold (exact in float16), within float16 rounding."""
import numpy as np
import pytest

from .test_fp8_views import CASES, HQ, bsr_views, cascade_levels, fp8_pool
from .test_gpu_views import nan_outputs, written

pytestmark = pytest.mark.gpu
D = 64
_modules = {}


def cuda_module(name, kv_dtype, build_cache):
    from attngen.runtime import CUDAAttention
    from attngen.variants import builtin

    key = (name, kv_dtype)
    if key not in _modules:
        _modules[key] = CUDAAttention.build(builtin(name), head_dims=(D,), dtypes=("float16",), layouts=("NHD",),
                                            kv_dtypes=(kv_dtype,) if kv_dtype else (), cache=build_cache)
    return _modules[key]


def on_gpu(pages, held, k_scale, v_scale):
    """The fp8 pages as torch fp8, the values held as float16, per-head scales as float32 CUDA tensors."""
    import torch

    fp8 = torch.from_numpy(pages.view(np.uint8)).cuda().view(getattr(torch, pages.dtype.name))
    scale = (lambda s: torch.from_numpy(s).cuda() if isinstance(s, np.ndarray) else s)  # noqa: E731
    return fp8, torch.from_numpy(held).half().cuda(), scale(k_scale), scale(v_scale)


def close(a, b):
    a, b = a.float().cpu().numpy(), b.float().cpu().numpy()
    return np.abs(a - b).max() <= 4e-3 * max(1.0, float(np.abs(b[np.isfinite(b)]).max(initial=0)))


def views_over_both(view_cls, name, kv_dtype, per_head, num_pages, rows, build_cache, rng):
    """(fp8 pages, the float16 pages of their values, the scales as keyword arguments, q [rows, Hq, D], the view
    class over ``name``'s fp8 library, and over its float16 one)."""
    import torch

    fp8_pages, held, k_scale, v_scale = on_gpu(*fp8_pool(rng, num_pages, kv_dtype, per_head, d=D, pow2=True))
    q = torch.randn(rows, HQ, D, dtype=torch.float16, device="cuda")
    return (fp8_pages, held, {"k_scale": k_scale, "v_scale": v_scale}, q,
            view_cls(cuda_module(name, kv_dtype, build_cache)), view_cls(cuda_module(name, None, build_cache)))


@pytest.mark.parametrize("kv_dtype,per_head", CASES)
@pytest.mark.parametrize("name", ["vanilla", "causal"])
def test_gpu_cascade_over_an_fp8_cache_equals_one_over_its_values(name, kv_dtype, per_head, build_cache, rng):
    from attngen.runtime import CascadeAttention

    fp8_pages, held, scales, q, fp8, ref = views_over_both(CascadeAttention, name, kv_dtype, per_head, 6, 5,
                                                           build_cache, rng)
    for mode in ("cascade", "flat"):
        out, lse = nan_outputs(q)
        fp8.run(q, plan=fp8.plan(cascade_levels(fp8_pages, "cuda"), 5, D, mode=mode, num_qo_heads=HQ), out=out,
                lse=lse, **scales)
        assert written(out, lse), mode
        ref_o, ref_l = ref.run(q, plan=ref.plan(cascade_levels(held, "cuda"), 5, D, mode=mode, num_qo_heads=HQ))
        assert close(out, ref_o) and close(lse, ref_l), mode


@pytest.mark.parametrize("kv_dtype,per_head", CASES)
@pytest.mark.parametrize("name", ["vanilla", "causal"])
def test_gpu_block_sparse_over_an_fp8_cache_equals_one_over_its_values(name, kv_dtype, per_head, build_cache, rng):
    from attngen.runtime import BlockSparseAttention

    fp8_pages, held, scales, q, fp8, ref = views_over_both(BlockSparseAttention, name, kv_dtype, per_head, 3, 12,
                                                           build_cache, rng)
    for view in bsr_views():
        out, lse = nan_outputs(q)
        fp8.run(q, fp8_pages, view, out=out, lse=lse, **scales)
        assert written(out, lse), type(view).__name__
        ref_o, ref_l = ref.run(q, held, view)
        assert close(out, ref_o) and close(lse, ref_l), type(view).__name__


def test_float_scales_are_filled_once_per_stream_and_never_kept_from_a_capture():
    """A float scale's device tensor is filled once per (value, stream) and reused by later calls; another value
    or stream gets its own; a CUDA graph capture fills one of its own that no later call reuses."""
    import torch

    from attngen.runtime import fp8

    q = torch.zeros(1, 4, 64, device="cuda")
    kw = dict(kv_dtype="float8_e4m3fn", num_kv_heads=2, like=q)
    a = fp8.device_kv_scales(0.5, "k_scale", **kw)
    assert a.dtype == torch.float32 and a.tolist() == [0.5, 0.5]
    assert fp8.device_kv_scales(0.5, "v_scale", **kw) is a
    b = fp8.device_kv_scales(0.25, "k_scale", **kw)
    assert b is not a and b.tolist() == [0.25, 0.25]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        c = fp8.device_kv_scales(0.5, "k_scale", **kw)
    torch.cuda.synchronize()
    assert c is not a and c.tolist() == [0.5, 0.5]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d = fp8.device_kv_scales(0.75, "k_scale", **kw)
    graph.replay()
    torch.cuda.synchronize()
    assert d.tolist() == [0.75, 0.75] and all(t is not d for t in fp8._FILLED.values())
    assert fp8.device_kv_scales(0.75, "k_scale", **kw) is not d
