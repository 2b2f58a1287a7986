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


def test_one_entry_scale_tensors_give_the_float_scales_bits(build_cache, rng):
    """A cache's scale given as a float, a 0-d or [1] CUDA tensor (passed to the kernels as it is, read by every KV
    head: csrc/fp8_kv.cuh KVScales) or [Hkv] copies of it gives the same bits on decode (both templates, split and
    not) and prefill (the automatic template and mma.sync), every row written."""
    import torch

    from attngen.runtime import PagedKV

    att = cuda_module("causal", "float8_e4m3fn", build_cache)
    pages, held, k_scale, v_scale = fp8_pool(rng, 6, "float8_e4m3fn", False, d=D)
    fp8_pages = on_gpu(pages, held, k_scale, v_scale)[0]
    i32 = dict(dtype=torch.int32, device="cuda")
    order = torch.from_numpy(rng.permutation(6).astype(np.int32)).cuda()
    kv = PagedKV(fp8_pages, torch.tensor([0, 4, 6], **i32), order, torch.tensor([3, 4], **i32))
    f32 = dict(dtype=torch.float32, device="cuda")
    forms = {"float": (k_scale, v_scale), "0-d": (torch.tensor(k_scale, **f32), torch.tensor(v_scale, **f32)),
             "[1]": (torch.tensor([k_scale], **f32), torch.tensor([v_scale], **f32)),
             "[Hkv]": (torch.full((2,), k_scale, **f32), torch.full((2,), v_scale, **f32))}
    q_decode = torch.randn(2, HQ, D, dtype=torch.float16, device="cuda")
    q_prefill = torch.randn(5, HQ, D, dtype=torch.float16, device="cuda")
    qo = torch.tensor([0, 3, 5], **i32)
    decode_plans = [att.plan_decode(kv, HQ, D, **a) for a in
                    ({}, {"tensor_cores": False}, {"num_chunks": 2, "tensor_cores": True})]
    prefill_plans = [att.plan_prefill(qo, kv, D, **a) for a in ({}, {"template": "mma_sync"})]
    results = {}
    for form, (ks, vs) in forms.items():
        outs = []
        for plan in decode_plans:
            out = torch.full_like(q_decode, float("nan"))
            outs.append(att.decode(q_decode, kv, plan=plan, out=out, k_scale=ks, v_scale=vs)[0])
        for plan in prefill_plans:
            out = torch.full_like(q_prefill, float("nan"))
            outs.append(att.prefill(q_prefill, kv, qo, plan=plan, out=out, k_scale=ks, v_scale=vs)[0])
        results[form] = outs
    torch.cuda.synchronize()
    assert all(not o.isnan().any() for o in results["float"])
    for form, outs in results.items():
        assert all(torch.equal(a, b) for a, b in zip(outs, results["float"])), form
