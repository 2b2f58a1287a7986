"""fp8 K/V in the decode templates (``csrc/fp8_kv.cuh``, ``csrc/entry_decode_fp8.h``; CUDA cores and tensor
cores) called through their exported functions in attngen's calling convention: on a GPU the entries of every
(query dtype, fp8 format, layout) against the float64 reference on the dequantised cache (``pytest -m gpu``).
The CPU suite's build of these entries for sm_80 and sm_90a (each query dtype, each fp8 format once) and its
exports: ``tests/test_fp8_cuda_build.py``, which loads it through ``CUDAAttention``.
"""
import numpy as np
import pytest

from attngen.codegen.pipeline import run_pipeline
from attngen.schedules.build_config import BuildConfig, symbol
from attngen.testing import fp8_tolerance
from attngen.variants import builtin


HEAD_DIM = 128
ENTRIES = [(q, kv, layout) for q in ("float16", "bfloat16") for kv in ("float8_e4m3fn", "float8_e5m2")
           for layout in ("NHD", "HND")]
PAIRS = list(dict.fromkeys((q, kv) for q, kv, _ in ENTRIES))
# the CPU tests' one fp8 decode build (tests/test_fp8_cuda_build.py), both ways of decoding fp8: in a few integer
# instructions before sm_89, by cvt from sm_89 on (cuda_fp8.h's branch; sm_89 takes sm_80's templates, compiled
# for it in the fp8 prefill tests)
BUILD_ARCHS = ("sm_80", "sm_90a")


def fp8_decode_library(variant, build_cache, archs: tuple[str, ...]):
    """``variant``'s decode library for every (query dtype, fp8 format) of ``PAIRS`` (the build's result)."""
    cfg = BuildConfig("cuda", (HEAD_DIM,), tuple(q for q, _ in PAIRS), archs, kernels=("decode",),
                      kv_dtypes=tuple(kv for _, kv in PAIRS))
    return run_pipeline(variant, cfg, cache=build_cache)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["causal", "rope"])  # k_scale folded into the query / applied before the key hook
def test_fp8_decode_matches_the_reference(name, build_cache):
    import torch
    import tvm_ffi

    from attngen.runtime import reference_attention
    from attngen.runtime.fp8 import kv_scale_for, quantize_kv
    from attngen.runtime.reference import gather_pages

    major, minor = torch.cuda.get_device_capability()
    arch = "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
    variant = builtin(name)
    mod = tvm_ffi.load_module(str(fp8_decode_library(variant, build_cache, (arch,)).library))
    rng = np.random.default_rng(0)
    extras = (1.0, 1e4) if name == "rope" else ()  # rope_scale, rope_theta
    params = dict(rope_scale=1.0, rope_theta=1e4) if name == "rope" else {}
    page_size, num_kv, group = 16, 2, 4
    kv_lens = [1, 37, 300, 16]
    for q_dtype, kv_dtype, layout in ENTRIES:
        n_pages = [-(-n // page_size) for n in kv_lens]
        total = sum(n_pages) + 3
        ids = rng.permutation(total)[:sum(n_pages)].astype(np.int32)
        raw = rng.standard_normal((total, 2, page_size, num_kv, HEAD_DIM)).astype(np.float32) * 3
        k_scale, v_scale = kv_scale_for(raw[:, 0].reshape(-1, num_kv, HEAD_DIM), kv_dtype), \
            kv_scale_for(raw[:, 1].reshape(-1, num_kv, HEAD_DIM), kv_dtype)
        pages = np.stack([quantize_kv(raw[:, 0], kv_dtype, k_scale), quantize_kv(raw[:, 1], kv_dtype, v_scale)], 1)
        if layout == "HND":
            pages = np.ascontiguousarray(pages.transpose(0, 1, 3, 2, 4))
        indptr = np.concatenate([[0], np.cumsum(n_pages)]).astype(np.int32)
        last = np.array([n - (p - 1) * page_size for n, p in zip(kv_lens, n_pages)], np.int32)
        keys, values = gather_pages(pages, indptr, ids, last, layout)
        batch = len(kv_lens)
        dev = torch.device("cuda")
        tq = torch.from_numpy(rng.standard_normal((batch, num_kv * group, HEAD_DIM)).astype(np.float32)).to(
            dev, getattr(torch, q_dtype))
        ref_o, ref_l = reference_attention(variant, tq.float().cpu().numpy(), keys, values,
                                           np.arange(batch + 1, dtype=np.int32), HEAD_DIM ** -0.5, params,
                                           k_scale=k_scale, v_scale=v_scale)
        # k x PyTorch's error in the query dtype on the dequantised values + floor
        tol = fp8_tolerance(tq.float().cpu().numpy(), np.arange(batch + 1), keys, values, k_scale, v_scale, ref_o,
                            q_dtype, HEAD_DIM ** -0.5)
        tpages = torch.from_numpy(pages.view(np.uint8)).to(dev).view(getattr(torch, kv_dtype))
        for chunks, backend in ((1, 1), (3, 1), (1, 2), (3, 2)):  # CUDA cores, tensor cores; even split
            o = torch.full_like(tq, float("nan"))
            lse = torch.full((batch, num_kv * group), float("nan"), device=dev)
            part_o = torch.empty((batch, chunks, num_kv * group, HEAD_DIM), device=dev)
            part_lse = torch.empty((batch, chunks, num_kv * group), device=dev)
            fn = mod[symbol(f"batch_decode_paged_{layout.lower()}", q_dtype, HEAD_DIM, kv_dtype)]
            fn(tq, tpages, torch.from_numpy(ids).to(dev), torch.from_numpy(indptr).to(dev),
               torch.from_numpy(last).to(dev), o, lse, torch.from_numpy(k_scale).to(dev),
               torch.from_numpy(v_scale).to(dev), HEAD_DIM ** -0.5, part_o, part_lse, chunks, backend, None, 0, 0, 1,
               *extras)
            torch.cuda.synchronize()
            err = float((o.double().cpu() - torch.from_numpy(ref_o)).abs().max())
            assert err <= tol, (name, q_dtype, kv_dtype, layout, chunks, backend, err)
            # the scores reach the tensor cores / dot products with the (transformed) keys rounded to the query
            # dtype: the lse moves by up to one unit of that dtype at the largest lse
            lse_tol = max(2e-2, float(torch.finfo(getattr(torch, q_dtype)).eps) * float(np.abs(ref_l).max()))
            assert float((lse.double().cpu() - torch.from_numpy(ref_l)).abs().max()) < lse_tol
