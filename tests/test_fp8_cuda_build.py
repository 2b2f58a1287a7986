"""fp8 K/V caches through the normal CUDA build and runtime: which configurations ``BuildConfig`` accepts
and refuses, the exports the library's decode emitter writes, a decode-only build for sm_80 and sm_90a compiled
with nvcc (no GPU needed; tests/test_fp8_cuda_decode.py's GPU tests call the entries), and on a GPU
``CUDAAttention.decode`` over fp8 pages with k_scale / v_scale against the float64 reference on the dequantised
cache (``pytest -m gpu``). Prefill over fp8 caches: tests/test_fp8_cuda_prefill.py."""
import numpy as np
import pytest

from attngen.cli import main
from attngen.codegen.cuda_library import exported_functions, translation_units
from attngen.codegen.pipeline import run_pipeline
from attngen.ir import ConfigError
from attngen.schedules import BuildConfig, DtypePair
from attngen.variants import builtin

from .conftest import requires_nvcc
from .test_fp8_cuda_decode import BUILD_ARCHS

HEAD_DIM = 128
FP8 = ("float8_e4m3fn", "float8_e5m2")
# every query dtype with every fp8 format: one build of decode entries
Q_DTYPES = ("float16", "float16", "bfloat16", "bfloat16")
KV_DTYPES = FP8 * 2


def fp8_decode_config(archs, dtypes=("float16", "bfloat16"), kv_dtypes=FP8, **kwargs) -> BuildConfig:
    return BuildConfig("cuda", (HEAD_DIM,), dtypes, archs, kernels=("decode",), kv_dtypes=kv_dtypes, **kwargs)


def loaded_fp8_library(variant, cfg: BuildConfig, build_cache):
    """``variant``'s library of ``cfg`` (fp8 pairs only) built and loaded as a ``CUDAAttention``, after checking
    that it exports what the config says, each an fp8 function."""
    from attngen.runtime import CUDAAttention

    res = run_pipeline(variant, cfg, cache=build_cache)
    assert res.manifest["functions"] == exported_functions(cfg)
    att = CUDAAttention(variant, res.library, res.manifest)
    for name in res.manifest["functions"]:
        assert "_kve" in name and att._mod[name] is not None
    return att


def test_cuda_accepts_fp8_caches_in_linked_builds():
    """link='lto' builds serve fp8 caches (tests/test_lto_build.py builds one); other templates stay refused."""
    def linked(kernels):
        return BuildConfig("cuda", (HEAD_DIM,), ("float16",), ("sm_90a",), kernels=kernels,
                           kv_dtypes=("float8_e5m2",), link="lto")

    assert linked(("decode", "prefill")).dtype_pairs == (DtypePair("float16", "float8_e5m2"),)
    with pytest.raises(ConfigError, match=r"read by the decode and prefill templates only"):
        linked(("tvm",))


def test_cuda_accepts_fp8_caches_for_decode_on_every_arch():
    for arch in ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90a"):  # cuda_fp8.h converts in software before sm_89
        cfg = fp8_decode_config((arch,), ("float16",), ("float8_e4m3fn",))
        assert cfg.dtype_pairs == (DtypePair("float16", "float8_e4m3fn"),)
    mixed = fp8_decode_config(("sm_90a",), ("float16", "bfloat16"), ("float8_e5m2", "bfloat16"))
    assert [p.kv_scaled for p in mixed.dtype_pairs] == [True, False]
    with pytest.raises(ConfigError, match=r"dtype bfloat16 is not supported on sm_75.*Turing"):
        fp8_decode_config(("sm_75",), ("bfloat16",), ("float8_e4m3fn",))


def test_cuda_refuses_fp8_caches_outside_the_decode_and_prefill_templates():
    with pytest.raises(ConfigError, match=r"kv_dtypes: fp8 K/V \(float8_e4m3fn\) on cuda are read by the decode and "
                                          r"prefill templates only: kernels \['decode', 'tvm'\] include \['tvm'\], "
                                          r"which read K/V in the query dtype on cuda\. Build the fp8 cache's cuda "
                                          r"kernels with kernels=\('decode',\) \(--kernels decode\)"):
        BuildConfig("cuda", (HEAD_DIM,), ("float16",), ("sm_90a",), kernels=("decode", "tvm"),
                    kv_dtypes=("float8_e4m3fn",))
    with pytest.raises(ConfigError, match=r"include \['tvm'\], .*kernels=\('decode', 'prefill'\) "
                                          r"\(--kernels decode,prefill\)"):
        BuildConfig("cuda", (HEAD_DIM,), ("float16",), ("sm_90a",), kernels=("tvm",), kv_dtypes=("float8_e5m2",))
    with pytest.raises(ConfigError, match=r"K/V dtype float16 with query dtype bfloat16 is not supported"):
        fp8_decode_config(("sm_90a",), ("bfloat16",), ("float16",))


def test_decode_emitter_writes_fp8_entries():
    cfg = fp8_decode_config(("sm_90a",), Q_DTYPES, KV_DTYPES)
    assert exported_functions(cfg) == sorted(f"batch_decode_paged_{lay}_{q}_kv{kv}_d{HEAD_DIM}" for lay in ("nhd", "hnd")
                                             for q in ("f16", "bf16") for kv in ("e4m3", "e5m2"))
    units = translation_units(builtin("causal"), cfg, HEAD_DIM, DtypePair("bfloat16", "float8_e5m2"))
    (name, text), = units.items()
    assert name == f"attention_d{HEAD_DIM}_bf16_kve5m2_decode.cu"
    assert '#include "entry_decode_fp8.h"' in text
    assert (f"attngen::DecodePagedFP8Entry<attngen_gen::Hooks_d{HEAD_DIM}, __nv_bfloat16, __nv_fp8_e5m2, {HEAD_DIM}, "
            "attngen::KVLayout::kHND, 8, kEntryName_batch_decode_paged_hnd_bf16_kve5m2_d128>::call") in text
    plain = translation_units(builtin("causal"), cfg, HEAD_DIM, DtypePair("float16", "float16"))
    assert all("fp8" not in text.lower() for text in plain.values())


def test_cli_kv_dtype_reaches_the_cuda_build(capsys):
    assert main(["build", "vanilla", "--target", "cuda", "--arch", "sm_90a", "--kv-dtype", "float8_e4m3fn",
                 "--kernels", "tvm"]) == 2
    assert "are read by the decode and prefill templates only" in capsys.readouterr().err
    from attngen.cli import _config, parser

    args = parser().parse_args(["build", "vanilla", "--target", "cuda", "--arch", "sm_89", "--kernels", "decode",
                                "--dtype", "float16,bfloat16", "--kv-dtype", "float8_e4m3fn,float8_e5m2"])
    assert _config(args) == fp8_decode_config(("sm_89",), layouts=("NHD", "HND"))


def test_scales_are_checked_without_reading_the_device():
    import torch

    from attngen.runtime import AttentionArgumentError
    from attngen.runtime.cuda import device_kv_scales

    q = torch.zeros(1, 4, HEAD_DIM)
    kw = dict(kv_dtype="float8_e4m3fn", num_kv_heads=2, like=q)
    with pytest.raises(AttentionArgumentError, match=r"v_scale: the KV cache is fp8 \(float8_e4m3fn\) and needs v_scale"):
        device_kv_scales(None, "v_scale", **kw)
    with pytest.raises(AttentionArgumentError, match=r"k_scale: scales must be finite and positive, got -1.0"):
        device_kv_scales(-1.0, "k_scale", **kw)
    with pytest.raises(AttentionArgumentError, match=r"k_scale: expected a float32 tensor, got float16"):
        device_kv_scales(torch.ones(2, dtype=torch.float16), "k_scale", **kw)
    with pytest.raises(AttentionArgumentError, match=r"k_scale: must be a CUDA tensor on q's device"):
        device_kv_scales(torch.ones(2), "k_scale", **kw)


@requires_nvcc
def test_fp8_decode_library_builds_and_checks_arguments(build_cache):
    """The build, then what of CUDAAttention and the exported entries runs without a GPU: the function lookup
    by the pages' dtype, and the entries' argument checks (every type before any device)."""
    import torch

    from attngen.runtime import AttentionArgumentError, PagedKV

    cfg = fp8_decode_config(BUILD_ARCHS)
    # each query dtype and each fp8 format once, both layouts (the GPU tests build all four pairs for the device)
    assert exported_functions(cfg) == sorted(f"batch_decode_paged_{lay}_{q}_kve{kv}_d{HEAD_DIM}" for q, kv in
                                             (("f16", "4m3"), ("bf16", "5m2")) for lay in ("nhd", "hnd"))
    att = loaded_fp8_library(builtin("causal"), cfg, build_cache)  # exports exported_functions(cfg), each fp8

    pages = torch.zeros(4, 2, 16, 2, HEAD_DIM).to(torch.float8_e4m3fn)
    i32 = dict(dtype=torch.int32)
    kv = PagedKV(pages, torch.tensor([0, 2], **i32), torch.tensor([3, 1], **i32), torch.tensor([5], **i32))
    plan = att.plan_decode(kv, 8, HEAD_DIM, num_chunks=1)
    q = torch.zeros(1, 8, HEAD_DIM, dtype=torch.float16)
    with pytest.raises(AttentionArgumentError, match=r"q: must be a CUDA tensor"):
        att.decode(q, kv, plan=plan, k_scale=1.0, v_scale=1.0)
    with pytest.raises(AttentionArgumentError, match=r"has no batch_decode_paged_nhd_bf16_kve4m3_d128: .*rebuild with "
                                                     r"dtypes including bfloat16 paired with kv_dtypes float8_e4m3fn"):
        att.decode(q.bfloat16(), kv, plan=plan)
    with pytest.raises(AttentionArgumentError, match=r"no decode function over a NHD float8_e5m2 cache at head_dim 64"):
        att.plan_decode(PagedKV(pages[..., :64].contiguous().view(torch.float8_e5m2), kv.indptr, kv.indices,
                                kv.last_page_len), 8, 64, num_chunks=1)
    with pytest.raises(AttentionArgumentError, match=r"kv.pages: dtype uint8 is no K/V dtype.*view\(torch.float8_e4m3fn\)"):
        att.plan_decode(PagedKV(pages.view(torch.uint8), kv.indptr, kv.indices, kv.last_page_len), 8, HEAD_DIM,
                        num_chunks=1)

    name = "batch_decode_paged_nhd_f16_kve4m3_d128"
    scale = torch.ones(2)
    args = dict(q=q, pages=pages, indices=kv.indices, indptr=kv.indptr, last_page_len=kv.last_page_len,
                o=torch.empty_like(q), lse=torch.empty(1, 8), k_scale=scale, v_scale=scale)

    def call(**over):
        att._mod[name](*{**args, **over}.values(), 0.1, *plan.launch.ffi_args())

    with pytest.raises(TypeError, match=rf"{name}: pages: expected element type float8_e4m3fn, got float8_e5m2"):
        call(pages=pages.view(torch.float8_e5m2))
    with pytest.raises(TypeError, match=rf"{name}: v_scale: expected element type float32, got float16"):
        call(v_scale=scale.half())
    with pytest.raises(ValueError, match=rf"{name}: q: expected a CUDA tensor"):
        call()


def _pages(rng, kv_dtype, layout, num_pages, page_size, num_kv):
    """Random float32 K/V pages [P, 2, S, Hkv, D] quantised to ``kv_dtype`` with per-head scales: (fp8 pages in
    ``layout`` as a numpy array of ml_dtypes, k_scale, v_scale)."""
    from attngen.runtime.fp8 import kv_scale_for, quantize_kv

    raw = rng.standard_normal((num_pages, 2, page_size, num_kv, HEAD_DIM)).astype(np.float32) * 3
    raw[:, :, :, 1] *= 0.05  # heads of different ranges: the scales differ per head
    k_scale = kv_scale_for(raw[:, 0].reshape(-1, num_kv, HEAD_DIM), kv_dtype)
    v_scale = kv_scale_for(raw[:, 1].reshape(-1, num_kv, HEAD_DIM), kv_dtype)
    pages = np.stack([quantize_kv(raw[:, 0], kv_dtype, k_scale), quantize_kv(raw[:, 1], kv_dtype, v_scale)], 1)
    if layout == "HND":
        pages = np.ascontiguousarray(pages.transpose(0, 1, 3, 2, 4))
    return pages, k_scale, v_scale


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["causal", "rope"])  # k_scale folded into the query / applied before the key hook
def test_cuda_attention_decodes_fp8_caches(name, build_cache, rng):
    import torch

    from attngen.runtime import CUDAAttention, PagedKV, reference_attention
    from attngen.runtime.reference import gather_pages
    from attngen.testing import check_decode_plans, fp8_tolerance

    variant = builtin(name)
    att = CUDAAttention.build(variant, head_dims=(HEAD_DIM,), dtypes=Q_DTYPES, kv_dtypes=KV_DTYPES,
                              kernels=("decode",), cache=build_cache)
    params = dict(rope_scale=1.0, rope_theta=1e4) if name == "rope" else {}
    page_size, num_kv, group = 16, 2, 4
    kv_lens = [1, 37, 0, 300, 16, 129]  # an empty request, odd lengths, a full last page
    dev = torch.device("cuda")
    for q_dtype, kv_dtype in zip(Q_DTYPES, KV_DTYPES):
        for layout in ("NHD", "HND"):
            n_pages = [-(-n // page_size) for n in kv_lens]
            total = sum(n_pages) + 3  # spare pages nobody reads
            ids = rng.permutation(total)[:sum(n_pages)].astype(np.int32)
            pages, k_scale, v_scale = _pages(rng, kv_dtype, layout, total, page_size, num_kv)
            indptr = np.concatenate([[0], np.cumsum(n_pages)]).astype(np.int32)
            last = np.array([n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, n_pages)], np.int32)
            keys, values = gather_pages(pages, indptr, ids, last, layout)
            batch = len(kv_lens)
            q = torch.from_numpy(rng.standard_normal((batch, num_kv * group, HEAD_DIM)).astype(np.float32)).to(
                dev, getattr(torch, q_dtype))
            ref_o, ref_l = reference_attention(variant, q.float().cpu().numpy(), keys, values,
                                               np.arange(batch + 1, dtype=np.int32), HEAD_DIM ** -0.5, params,
                                               k_scale=k_scale, v_scale=v_scale)
            kv = PagedKV(torch.from_numpy(pages.view(np.uint8)).to(dev).view(getattr(torch, kv_dtype)),
                         torch.from_numpy(indptr).to(dev), torch.from_numpy(ids).to(dev),
                         torch.from_numpy(last).to(dev), layout)
            scales = dict(k_scale=torch.from_numpy(k_scale).to(dev), v_scale=torch.from_numpy(v_scale).to(dev))
            # k x PyTorch's error in the query dtype on the dequantised values + floor; the empty request must
            # give O = 0, lse = -inf
            plans = ({}, {"tensor_cores": False}, {"num_chunks": 3, "tensor_cores": True})
            tol = fp8_tolerance(q.float().cpu().numpy(), np.arange(batch + 1), keys, values, k_scale, v_scale,
                                ref_o, q_dtype, HEAD_DIM ** -0.5)
            check_decode_plans(att, q, kv, HEAD_DIM, plans, ref_o, ref_l, tol=tol,
                               lse_eps=float(torch.finfo(getattr(torch, q_dtype)).eps),
                               what=f"{name} {q_dtype} {kv_dtype} {layout}", params=params, **scales)


@pytest.mark.gpu
def test_cuda_fp8_decode_refuses_missing_and_misplaced_scales(build_cache, rng):
    import torch

    from attngen.runtime import AttentionArgumentError, CUDAAttention, PagedKV

    att = CUDAAttention.build(builtin("vanilla"), head_dims=(HEAD_DIM,), dtypes=("float16",),
                              kv_dtypes=("float8_e4m3fn",), kernels=("decode",), cache=build_cache)
    dev = torch.device("cuda")
    pages = torch.zeros(4, 2, 16, 2, HEAD_DIM, device=dev).to(torch.float8_e4m3fn)
    i32 = dict(dtype=torch.int32, device=dev)
    kv = PagedKV(pages, torch.tensor([0, 2], **i32), torch.tensor([3, 1], **i32), torch.tensor([5], **i32))
    q = torch.zeros(1, 8, HEAD_DIM, dtype=torch.float16, device=dev)
    with pytest.raises(AttentionArgumentError, match=r"k_scale: the KV cache is fp8 \(float8_e4m3fn\) and needs"):
        att.decode(q, kv, v_scale=1.0)
    with pytest.raises(AttentionArgumentError, match=r"v_scale: shape \(3,\); expected \[\] or \[1\]"):
        att.decode(q, kv, k_scale=1.0, v_scale=torch.ones(3, device=dev))
    with pytest.raises(AttentionArgumentError, match=r"has no batch_decode_paged_nhd_bf16_kve4m3_d128.*paired with "
                                                     r"kv_dtypes float8_e4m3fn"):
        att.decode(q.bfloat16(), kv, k_scale=1.0, v_scale=1.0)
    out, _ = att.decode(q, kv, k_scale=torch.ones(1, device=dev), v_scale=1.0)
    assert torch.all(out == 0)
    f16 = PagedKV(pages.half(), kv.indptr, kv.indices, kv.last_page_len)
    with pytest.raises(AttentionArgumentError, match=r"has no batch_decode_paged_nhd_f16_d128"):
        att.decode(q, f16)
