"""fp8 K/V caches on both prefill templates: mma.sync (``csrc/kv_staging.cuh``) and Hopper
(``csrc/hopper_fp8_stage.cuh``), through ``csrc/entry_prefill_fp8.h``.

Without a GPU: the build configurations accepted and refused (each refusal naming the argument and the fix),
the exports and translation units, the shared-memory figures of the staged tiles, a prefill library for sm_89
and sm_90a compiled with nvcc and the plans and refusals its runtime makes before any launch, and the hook paths
(key, output and tile-map kernels) compiled for each arch, the Hopper template's fp8 instances on sm_90a. On a GPU
(``pytest -m gpu``), for each template (Hopper on compute capability 9.0 only): ``CUDAAttention.prefill`` over fp8
caches against the float64 reference on the dequantised values (``reference_attention(..., k_scale=,
v_scale=)``; the problems of tests/test_fp8_kv.py): ragged, paged NHD and HND with random page permutations,
empty and odd-length requests, causal and non-causal, GQA, head_dim 64 and 128, float16 and bfloat16 queries,
e4m3 and e5m2 (two of the four pairs per variant, all four across them), per-tensor and per-head scales, both
query tiles of the mma.sync template, outputs pre-filled with NaN.
"""
import re

import numpy as np
import pytest

from attngen.codegen.cuda_library import exported_functions, translation_units
from attngen.codegen.pipeline import run_pipeline
from attngen.ir import ConfigError
from attngen.schedules import BuildConfig, DtypePair
from attngen.schedules.arch import arch_spec
from attngen.schedules.dtypes import ElementBytes
from attngen.schedules.registry import fit_problems
from attngen.schedules.template_prefill import PREFILL, PrefillConfig
from attngen.schedules.template_prefill_hopper import PREFILL_HOPPER, HopperConfig
from attngen.variants import builtin

from .conftest import requires_nvcc
from .test_fp8_cuda_build import loaded_fp8_library

FP8 = ("float8_e4m3fn", "float8_e5m2")
Q_DTYPES = ("float16", "float16", "bfloat16", "bfloat16")  # every query dtype with every fp8 format
KV_DTYPES = FP8 * 2
# a long request (several K/V tiles, the 128-row tile), an empty one, odd lengths, one row, rows without keys
QO_LENS = [130, 0, 37, 1, 3, 64]
KV_LENS = [700, 17, 37, 1, 0, 301]
# the variants the GPU test runs: non-causal, causal, a key hook (k_scale before it), an output hook (v_scale
# before it), a mask walked through tile maps, and the unnormalised sum state
GPU_VARIANTS = ("vanilla", "causal", "rope", "attention_sink", "custom_mask", "sigmoid")


def gpu_pairs(name: str) -> tuple[tuple[str, str], ...]:
    """The (query dtype, fp8 format) pairs the GPU test builds for a variant: both query dtypes, each with
    another format, the formats swapped from one variant to the next, so that every pair of Q_DTYPES x FP8
    runs (on three variants) while a library holds two pairs instead of four."""
    swap = GPU_VARIANTS.index(name) % 2
    return ("float16", FP8[swap]), ("bfloat16", FP8[1 - swap])
TEMPLATES = ("mma_sync", "hopper")


def fp8_prefill_config(archs, dtypes=("float16", "bfloat16"), kv_dtypes=FP8, head_dims=(128,), **kwargs):
    return BuildConfig("cuda", head_dims, dtypes, archs, kernels=("prefill",), kv_dtypes=kv_dtypes, **kwargs)


def test_cuda_accepts_fp8_caches_for_prefill_and_exports_them():
    for arch in ("sm_80", "sm_86", "sm_89", "sm_90a"):
        assert fp8_prefill_config((arch,)).dtype_pairs == (DtypePair("float16", "float8_e4m3fn"),
                                                            DtypePair("bfloat16", "float8_e5m2"))
    # the default kernels (decode and prefill), beside a 16-bit cache of the same query dtype
    cfg = BuildConfig("cuda", (128,), ("float16", "float16"), ("sm_89", "sm_90a"),
                      kv_dtypes=("float16", "float8_e4m3fn"))
    prefill = [f for f in exported_functions(cfg) if "prefill" in f]
    assert prefill == sorted(f"{kind}_{pair}_d128" for pair in ("f16", "f16_kve4m3") for kind in (
        "batch_prefill_ragged", "batch_prefill_paged_nhd", "batch_prefill_paged_hnd", "prefill_tile_map"))
    units = translation_units(builtin("causal"), cfg, 128, DtypePair("float16", "float8_e4m3fn"))
    text = units["attention_d128_f16_kve4m3_prefill.cu"]
    assert '#include "entry_prefill_fp8.h"' in text
    for entry in ("PrefillRaggedFP8Entry<attngen_gen::Hooks_d128, half, __nv_fp8_e4m3, 128, "
                  "kEntryName_batch_prefill_ragged_f16_kve4m3_d128>::call",
                  "PrefillPagedFP8Entry<attngen_gen::Hooks_d128, half, __nv_fp8_e4m3, 128, attngen::KVLayout::kHND, "
                  "kEntryName_batch_prefill_paged_hnd_f16_kve4m3_d128>::call",
                  "TileMapEntry<attngen_gen::Hooks_d128, 128, kEntryName_prefill_tile_map_f16_kve4m3_d128>::call"):
        assert entry in text
    plain = translation_units(builtin("causal"), cfg, 128, DtypePair("float16", "float16"))
    assert all("fp8" not in t.lower() for t in plain.values())  # 16-bit caches: the sources of before


def test_cuda_refuses_fp8_prefill_configurations_naming_the_fix():
    with pytest.raises(ConfigError, match=r"kernels \['prefill', 'tvm'\] include \['tvm'\], which read K/V in the "
                                          r"query dtype on cuda\. Build the fp8 cache's cuda kernels with "
                                          r"kernels=\('prefill',\) \(--kernels prefill\)"):
        BuildConfig("cuda", (128,), ("float16",), ("sm_90a",), kernels=("prefill", "tvm"),
                    kv_dtypes=("float8_e4m3fn",))
    # linked builds serve fp8 caches too (tests/test_lto_build.py builds one)
    assert fp8_prefill_config(("sm_89",), ("float16",), ("float8_e5m2",), link="lto").link == "lto"
    with pytest.raises(ConfigError, match=r"dtype float8_e4m3fn is a K/V cache storage format, not a query/output "
                                          r"dtype; keep the query dtype in dtypes and give float8_e4m3fn in kv_dtypes"):
        fp8_prefill_config(("sm_89",), ("float8_e4m3fn",), ("float8_e4m3fn",))
    assert fp8_prefill_config(("sm_89",), link="check").link == "check"  # device code only: served


def test_staged_tiles_count_the_staging_area():
    """One 16-bit K/V tile plus one fp8 staging tile (csrc/kv_staging.cuh): less than two 16-bit stages, so on
    sm_89 (99 KB per block) an fp8 cache gets the 128-row tile at head_dim 128 and the big tile at 256 that a
    16-bit one does not; the small tile (one stage) grows by the staging tile, which sm_75 cannot hold at
    head_dim 128."""
    fp8, half = ElementBytes(2, 1), ElementBytes(2, 2)
    ada = arch_spec("sm_89").smem_per_block
    for cfg in (PrefillConfig(128, False, 2), PrefillConfig(256, False)):
        assert PREFILL.smem_bytes(cfg, fp8) <= ada < PREFILL.smem_bytes(cfg, half)
    for cfg in (PrefillConfig(64, False, 2), PrefillConfig(128, False)):  # two 16-bit stages fit as well
        assert PREFILL.smem_bytes(cfg, fp8) < PREFILL.smem_bytes(cfg, half) <= ada
    pairs = (DtypePair("float16", "float8_e4m3fn"), DtypePair("bfloat16", "float8_e5m2"))
    assert fit_problems(arch_spec("sm_89"), ("prefill",), (64, 128, 256), pairs, 8, False) == []
    assert fit_problems(arch_spec("sm_75"), ("prefill",), (64, 128), pairs[:1], 8, False) == [
        "prefill head_dim 128 needs 70656 B of shared memory, sm_75 has 65536 B"]


def test_hopper_fp8_tiles_are_staged_inside_the_stages():
    """The Hopper template widens fp8 rows in place in the upper half of their 16-bit stage
    (csrc/hopper_fp8_stage.cuh): an fp8 cache needs a 16-bit cache's shared memory, which sm_90a holds at every
    head_dim."""
    for d in PREFILL_HOPPER.head_dims:
        cfg = HopperConfig(d)
        assert PREFILL_HOPPER.smem_bytes(cfg, ElementBytes(2, 1)) == PREFILL_HOPPER.smem_bytes(cfg, ElementBytes(2, 2))
    pairs = (DtypePair("float16", "float8_e4m3fn"), DtypePair("bfloat16", "float8_e5m2"))
    assert fit_problems(arch_spec("sm_90a"), ("prefill",), (64, 128, 256), pairs, 8, False) == []


def _host_kv(rng, kv_dtype, *, ragged=False, head_dim=128):
    """A small fp8 cache in host torch tensors (planning reads host copies), and its qo_indptr."""
    import torch

    from attngen.runtime import PagedKV, RaggedKV

    i32 = dict(dtype=torch.int32)
    fp8 = getattr(torch, kv_dtype)
    qo_indptr = torch.tensor([0, 3, 8], **i32)
    if ragged:
        k = torch.from_numpy(rng.standard_normal((20, 2, head_dim)).astype(np.float32)).to(fp8)
        return RaggedKV(k, k.clone(), torch.tensor([0, 5, 20], **i32)), qo_indptr
    pages = torch.from_numpy(rng.standard_normal((4, 2, 16, 2, head_dim)).astype(np.float32)).to(fp8)
    return PagedKV(pages, torch.tensor([0, 1, 3], **i32), torch.tensor([2, 0, 3], **i32),
                   torch.tensor([5, 9], **i32)), qo_indptr


@requires_nvcc
def test_fp8_prefill_library_builds_for_sm89_and_sm90a(build_cache, rng):
    """The build, then what of CUDAAttention and the exported entries runs without a GPU: planning (the library's
    choice with the Hopper template's work order, or either template forced), the function lookup by the cache's
    dtype, and the entries' argument checks (every type before any device)."""
    import torch

    from attngen.runtime import AttentionArgumentError
    from attngen.schedules.ffi_enums import PrefillTemplate

    att = loaded_fp8_library(builtin("causal"), fp8_prefill_config(("sm_89", "sm_90a")), build_cache)

    kv, qo_indptr = _host_kv(rng, "float8_e4m3fn")
    plan = att.plan_prefill(qo_indptr, kv, 128)  # host tensors stand for any device: the Hopper one may run
    assert plan.kernel == PrefillTemplate.AUTO and plan.lengths is not None
    forced = att.plan_prefill(qo_indptr, kv, 128, template="mma_sync")
    assert forced.kernel == PrefillTemplate.MMA_SYNC and forced.lengths is None  # mma.sync takes no work order
    assert att.plan_prefill(qo_indptr, kv, 128, template="hopper").kernel == PrefillTemplate.HOPPER
    ragged, _ = _host_kv(rng, "float8_e5m2", ragged=True, head_dim=64)
    with pytest.raises(AttentionArgumentError, match=r"no prefill function over a ragged float8_e5m2 cache at "
                                                     r"head_dim 64: .*rebuild with kv_dtypes including float8_e5m2, "
                                                     r"kernels including prefill, head_dims including 64"):
        att.plan_prefill(qo_indptr, ragged, 64)
    q = torch.zeros(8, 4, 128, dtype=torch.float16)
    with pytest.raises(AttentionArgumentError, match=r"has no batch_prefill_paged_nhd_bf16_kve4m3_d128: .*rebuild "
                                                     r"with dtypes including bfloat16 paired with kv_dtypes "
                                                     r"float8_e4m3fn"):
        att.prefill(q.bfloat16(), kv, qo_indptr, plan=plan, k_scale=1.0, v_scale=1.0)
    with pytest.raises(AttentionArgumentError, match=r"q: must be a CUDA tensor"):
        att.prefill(q, kv, qo_indptr, plan=plan, k_scale=1.0, v_scale=1.0)

    name = "batch_prefill_paged_nhd_f16_kve4m3_d128"
    scale = torch.ones(2)
    args = dict(q=q, pages=kv.pages, indices=kv.indices, indptr=kv.indptr, last_page_len=kv.last_page_len,
                qo_indptr=qo_indptr, o=torch.empty_like(q), lse=torch.empty(8, 4), k_scale=scale, v_scale=scale)

    def call(**over):
        att._mod[name](*{**args, **over}.values(), 0.1, *plan.ffi_args())

    with pytest.raises(TypeError, match=rf"{name}: pages: expected element type float8_e4m3fn, got float8_e5m2"):
        call(pages=kv.pages.view(torch.float8_e5m2))
    with pytest.raises(TypeError, match=rf"{name}: k_scale: expected element type float32, got float16"):
        call(k_scale=scale.half())
    with pytest.raises(ValueError, match=rf"{name}: q: expected a CUDA tensor"):
        call()


def test_gpu_test_pairs_cover_every_query_and_fp8_format():
    assert {pair for name in GPU_VARIANTS for pair in gpu_pairs(name)} == set(zip(Q_DTYPES, KV_DTYPES))
    assert all(len({q for q, _ in gpu_pairs(n)}) == 2 for n in GPU_VARIANTS)


@requires_nvcc
@pytest.mark.parametrize("name,arch", [("sigmoid", "sm_80"), ("attention_sink", "sm_86"), ("custom_mask", "sm_89"),
                                       ("rope", "sm_90a")])
def test_fp8_prefill_hook_paths_compile(name, arch, build_cache):
    """Every kernel instance of a variant with a key hook, an output hook, a tile-mapped mask or a sum state,
    at head_dim 64 and 256, compiled to device code (link='check': no library); on sm_90a the Hopper template's
    fp8 instances among them (the key hook there: the producer widens the keys, then applies k_scale and the
    hook)."""
    cfg = fp8_prefill_config((arch,), ("bfloat16",), ("float8_e5m2",), head_dims=(64, 256), link="check")
    res = run_pipeline(builtin(name), cfg, cache=build_cache)
    assert set(res.manifest["cubins"]) == {f"attention_d{d}_bf16_kve5m2_prefill_{arch}.cubin" for d in (64, 256)}
    for d in (64, 256):
        cubin = (res.directory / f"attention_d{d}_bf16_kve5m2_prefill_{arch}.cubin").read_bytes()
        hopper = re.search(rb"hopper_prefill_kernel\w*__nv_fp8_e5m2", cubin)
        assert (hopper is not None) == (arch == "sm_90a")


# ---- GPU -----------------------------------------------------------------------------------------------------

_libs = {}


def fp8_prefill_module(name, build_cache, dtypes=Q_DTYPES, kv_dtypes=KV_DTYPES, head_dims=(64, 128)):
    """``name``'s prefill library for this GPU over every (query dtype, K/V dtype) pair asked for."""
    from attngen.runtime import CUDAAttention

    key = (name, dtypes, kv_dtypes, head_dims)
    if key not in _libs:
        _libs[key] = CUDAAttention.build(builtin(name), head_dims=head_dims, dtypes=dtypes, kv_dtypes=kv_dtypes,
                                         kernels=("prefill",), cache=build_cache)
    return _libs[key]


def fp8_tensor(a: np.ndarray, kv_dtype: str):
    """An ml_dtypes fp8 array as a torch fp8 tensor on the GPU (the same bits)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).cuda().view(getattr(torch, kv_dtype))


def fp8_case(rng, q_dtype, kv_dtype, *, kv_mode, head_dim, group, per_tensor, num_kv=2, qo_lens=QO_LENS,
             kv_lens=KV_LENS):
    """(problem, k_scale, v_scale, kv view on the GPU): per-head scales far apart, so that a kernel reading
    another head's scale fails."""
    from attngen.runtime import PagedKV, RaggedKV

    from .test_fp8_kv import quantised_problem
    from .test_gpu_decode import to_torch

    layout = "HND" if kv_mode == "HND" else "NHD"
    prob, k_scale, v_scale = quantised_problem(rng, kv_dtype, q_dtype, qo_lens=qo_lens, kv_lens=kv_lens,
                                               num_qo_heads=num_kv * group, num_kv_heads=num_kv, layout=layout,
                                               page_size=16, head_dim=head_dim, per_tensor=per_tensor)
    if not per_tensor:  # the dequantised values are stored x scale: the reference and the kernel see the same
        k_scale = (k_scale * np.array([1.0, 0.05], np.float32)).astype(np.float32)
        v_scale = (v_scale * np.array([0.25, 3.0], np.float32)).astype(np.float32)
    if kv_mode == "ragged":
        kv = RaggedKV(fp8_tensor(prob.ragged.k, kv_dtype), fp8_tensor(prob.ragged.v, kv_dtype),
                      to_torch(prob.ragged.indptr))
    else:
        kv = PagedKV(fp8_tensor(prob.paged.pages, kv_dtype), to_torch(prob.paged.indptr),
                     to_torch(prob.paged.indices), to_torch(prob.paged.last_page_len), layout)
    return prob, k_scale, v_scale, kv


def skip_unless_template_runs(template: str) -> None:
    """The Hopper template runs on devices of compute capability 9.0 only."""
    import torch

    if template == "hopper" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper prefill template needs a GPU of compute capability 9.0")


def check_fp8_prefill(att, rng, q_dtype, kv_dtype, *, kv_mode, head_dim, group, per_tensor, plans, **lens) -> list:
    """Runs ``att``'s prefill under each of ``plans`` (plan_prefill keywords) over one fp8 case (fp8_case; ``lens``:
    its qo_lens / kv_lens) against the float64 reference on the dequantised values, outputs pre-filled with NaN;
    returns the plans made."""
    import torch

    from attngen.runtime import reference_attention
    from attngen.testing import compare, fp8_tolerance, random_params

    from .test_gpu_decode import to_torch

    variant = att.variant
    prob, k_scale, v_scale, kv = fp8_case(rng, q_dtype, kv_dtype, kv_mode=kv_mode, head_dim=head_dim, group=group,
                                          per_tensor=per_tensor, **lens)
    params = random_params(variant, rng, prob)
    sm_scale = head_dim ** -0.5
    ref_o, ref_l = reference_attention(variant, prob.q, prob.keys, prob.values, prob.qo_indptr, sm_scale, params,
                                       k_scale=k_scale, v_scale=v_scale)
    q = to_torch(prob.q, q_dtype)
    qo_indptr = to_torch(prob.qo_indptr)
    dev_params = {k: (to_torch(x) if isinstance(x, np.ndarray) else x) for k, x in params.items()}
    scales = (dict(k_scale=k_scale, v_scale=v_scale) if per_tensor else
              dict(k_scale=torch.from_numpy(k_scale).cuda(), v_scale=torch.from_numpy(v_scale).cuda()))
    # k x PyTorch's error in the query dtype on the dequantised values + floor; keys rounded to the query dtype
    # after a key hook move the lse by up to one unit at the largest lse
    finite = np.abs(ref_l[np.isfinite(ref_l)])
    tol = fp8_tolerance(prob.q, prob.qo_indptr, prob.keys, prob.values, k_scale, v_scale, ref_o, q_dtype, sm_scale)
    lse_tol = max(2e-2, float(torch.finfo(q.dtype).eps) * float(finite.max(initial=0.0)))
    made = []
    for plan_args in plans:
        plan = att.plan_prefill(qo_indptr, kv, head_dim, **plan_args)
        made.append(plan)
        out = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:2], float("nan"), device="cuda")
        att.prefill(q, kv, qo_indptr, plan=plan, sm_scale=sm_scale, params=dev_params, out=out, lse=lse, **scales)
        torch.cuda.synchronize()
        compare(out.float().cpu().numpy(), lse.cpu().numpy(), ref_o, ref_l, tol=tol, lse_tol=lse_tol,
                what=f"{variant.name} {q_dtype} {kv_dtype} {kv_mode} d{head_dim} g{group} "
                     f"{'per-tensor' if per_tensor else 'per-head'} {plan_args}")
    return made


@pytest.mark.gpu
@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("name", GPU_VARIANTS)
def test_fp8_prefill_matches_the_reference_on_dequantised_values(name, template, build_cache, rng):
    from attngen.ir.mask_class import mask_needs_map

    skip_unless_template_runs(template)
    pairs = gpu_pairs(name)
    att = fp8_prefill_module(name, build_cache, tuple(q for q, _ in pairs), tuple(kv for _, kv in pairs))
    # the mma.sync template's two query tiles; the Hopper template has one
    plans = [dict(template=template, wide_tiles=wide)
             for wide in ((False, True) if template == "mma_sync" else (None,))]
    if mask_needs_map(att.variant):  # the mask hook on every tile instead of the map
        plans.append(dict(template=template, tile_map=False))
    for q_dtype, kv_dtype in pairs:
        for head_dim, group in ((64, 5), (128, 4)):
            for kv_mode in ("ragged", "NHD", "HND"):
                per_tensor = (head_dim == 64) != (kv_mode == "HND")  # both kinds for every pair and view
                check_fp8_prefill(att, rng, q_dtype, kv_dtype, kv_mode=kv_mode, head_dim=head_dim, group=group,
                                  per_tensor=per_tensor, plans=plans)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["causal", "attention_sink"])
def test_fp8_appends_split_their_keys_on_the_mma_sync_template(name, build_cache, rng):
    """Appends over an fp8 cache (a verify step of 8 rows at GQA 4 over 8k keys, an empty request, 3 rows over
    3000 keys; per-head scales) split their keys on the mma.sync template (runtime/mma_split.py): v_scale and the
    output hook apply once the chunks merge. Against the float64 reference on the dequantised values, with the
    split and without."""
    pairs = gpu_pairs(name)
    att = fp8_prefill_module(name, build_cache, tuple(q for q, _ in pairs), tuple(kv for _, kv in pairs))
    for (q_dtype, kv_dtype), kv_mode in zip(pairs, ("NHD", "ragged")):
        plans = [dict(template="mma_sync", tail_split=split) for split in (None, False)]
        made = check_fp8_prefill(att, rng, q_dtype, kv_dtype, kv_mode=kv_mode, head_dim=128, group=4,
                                 per_tensor=False, plans=plans, qo_lens=[8, 0, 3], kv_lens=[8192, 5, 3000])
        for split, plan in zip((True, False), made):
            orders = [o for key, o in plan.orders.items() if key[0] == "mma"]
            assert (len(orders) == 1 and orders[0] is not None) == split, (kv_mode, split)


@pytest.mark.gpu
def test_fp8_prefill_refuses_missing_scales_and_serves_either_template(build_cache, rng):
    import torch

    from attngen.runtime import AttentionArgumentError
    from attngen.schedules.ffi_enums import PrefillTemplate

    from .test_gpu_decode import to_torch

    att = fp8_prefill_module("causal", build_cache, ("float16", "float16"), ("float16", "float8_e4m3fn"), (128,))
    prob, k_scale, v_scale, kv = fp8_case(rng, "float16", "float8_e4m3fn", kv_mode="NHD", head_dim=128, group=4,
                                          per_tensor=True)
    q, qo_indptr = to_torch(prob.q, "float16"), to_torch(prob.qo_indptr)
    plan = att.plan_prefill(qo_indptr, kv, 128)
    assert plan.kernel == PrefillTemplate.AUTO  # the library's choice, as for a 16-bit cache
    with pytest.raises(AttentionArgumentError, match=r"k_scale: the KV cache is fp8 \(float8_e4m3fn\) and needs"):
        att.prefill(q, kv, qo_indptr, plan=plan, v_scale=v_scale)
    with pytest.raises(AttentionArgumentError, match=r"v_scale: shape \(3,\); expected \[\] or \[1\]"):
        att.prefill(q, kv, qo_indptr, plan=plan, k_scale=k_scale, v_scale=torch.ones(3, device="cuda"))
    half = type(kv)(kv.pages.half(), kv.indptr, kv.indices, kv.last_page_len, kv.layout)  # a 16-bit cache
    with pytest.raises(AttentionArgumentError, match=r"k_scale/v_scale: the KV cache is float16, not fp8"):
        att.prefill(q, half, qo_indptr, plan=att.plan_prefill(qo_indptr, half, 128), k_scale=1.0, v_scale=1.0)
    if torch.cuda.get_device_capability() != (9, 0):
        # the entry refuses the Hopper template where it cannot run, saying why
        fn = att._mod["batch_prefill_paged_nhd_f16_kve4m3_d128"]
        scales = torch.full((2,), k_scale, device="cuda"), torch.full((2,), v_scale, device="cuda")
        hopper = plan.ffi_args()[:2] + (PrefillTemplate.HOPPER,) + plan.ffi_args()[3:]
        with pytest.raises(ValueError, match=r"kernel: the Hopper prefill template needs a library built for sm_90a "
                                             r"and a device of compute capability 9.0"):
            fn(q, kv.pages, kv.indices, kv.indptr, kv.last_page_len, qo_indptr, torch.empty_like(q),
               torch.empty(q.shape[:2], device="cuda"), *scales, 128 ** -0.5, *hopper)
        return
    # both templates over the same fp8 cache: the same values up to the rounding of the output
    outs = {}
    for template in TEMPLATES:
        out = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:2], float("nan"), device="cuda")
        att.prefill(q, kv, qo_indptr, plan=att.plan_prefill(qo_indptr, kv, 128, template=template), out=out, lse=lse,
                    k_scale=k_scale, v_scale=v_scale)
        outs[template] = out.float(), lse
    (o_m, l_m), (o_h, l_h) = outs["mma_sync"], outs["hopper"]
    assert torch.isfinite(o_h).all() and torch.equal(torch.isinf(l_h), torch.isinf(l_m))
    assert float((o_h - o_m).abs().max()) <= 4e-3 * max(1.0, float(o_m.abs().max()))
    finite = torch.isfinite(l_m)
    assert float((l_h[finite] - l_m[finite]).abs().max()) <= 2e-2
