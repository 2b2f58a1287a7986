"""The template registry: records, their arch predicates and shared-memory functions, the generated tile
header, the dtype fields of a build and its symbols, and the runtime planner reading the same record."""
import dataclasses

import pytest

from attngen.codegen.backends import BuildContext, backend_for
from attngen.codegen.backends.cuda import VARIANT_CHECKS
from attngen.codegen.cuda_library import ENTRY_EMITTERS, exported_functions
from attngen.codegen.cuda_tvm_slots import tvm_slot_functions
from attngen.codegen.pipeline import STAGES
from attngen.ir import ConfigError
from attngen.runtime import decode_plan
from attngen.schedules import ARCHS, BuildConfig, DtypePair, TEMPLATES, arch_spec
from attngen.schedules.build_config import symbol
from attngen.schedules.dtypes import ElementBytes
from attngen.schedules.registry import KERNELS, arch_problems, fit_problems, instantiated, template
from attngen.schedules.template_decode_tc import DECODE_TC, DecodeTCConfig
from attngen.schedules.template_prefill import PREFILL, PrefillConfig
from attngen.schedules.templates import ArchNeeds
from attngen.schedules.tile_header import HEADER_MACRO, tiles_header
from attngen.variants import BUILTINS, builtin

HALF = ElementBytes(2, 2)


def test_records_name_what_the_cuda_backend_provides():
    assert KERNELS == ("decode", "prefill", "tvm")
    for record in TEMPLATES.values():
        assert set(record.requires) <= set(TEMPLATES), record.name
        if record.selectable:
            assert record.emitter in ENTRY_EMITTERS and record.headers, record.name
        assert record.variant_check is None or record.variant_check in VARIANT_CHECKS
    # the tvm slot family's exports are the functions its emitters write
    cfg = BuildConfig("cuda", (64, 128), ("float16", "bfloat16"), ("sm_90a",), kernels=("tvm",))
    assert exported_functions(cfg) == sorted(tvm_slot_functions(cfg.head_dims, cfg.dtypes))


def test_kernels_instantiate_what_they_require():
    assert [r.name for r in instantiated(("decode",))] == ["decode_tc", "decode"]
    assert [r.name for r in instantiated(("tvm",))] == ["decode_tc", "decode", "prefill", "tvm"]
    assert instantiated(()) == []
    with pytest.raises(ConfigError, match=r"kernel 'decode_tc' is not supported by the CUDA templates; "
                                          r"supported: \['decode', 'prefill', 'tvm'\]"):
        BuildConfig("cuda", (128,), ("float16",), ("sm_80",), kernels=("decode_tc",))


def test_arch_predicates_read_the_arch_spec():
    for arch in ARCHS.values():
        assert arch_problems(arch, ("decode", "prefill", "tvm")) == []
    no_tensor_cores = dataclasses.replace(arch_spec("sm_80"), name="sm_test", mma=())
    assert arch_problems(no_tensor_cores, ("prefill",)) == [
        "the prefill template needs tensor-core shapes ['m16n8k16', 'm16n8k8'] (it has []), which sm_test lacks"]
    assert [p.split(" template")[0] for p in arch_problems(no_tensor_cores, ("decode",))] == ["the decode_tc"]
    hopper_only = ArchNeeds(wgmma=True, tma=True, cp_async=True)
    assert hopper_only.missing(arch_spec("sm_90a")) == []
    assert hopper_only.missing(arch_spec("sm_80")) == ["wgmma", "TMA"]
    assert hopper_only.missing(arch_spec("sm_75")) == ["cp.async", "wgmma", "TMA"]


def test_shared_memory_takes_element_sizes_from_the_dtypes():
    assert DtypePair("bfloat16", "bfloat16").element_bytes == HALF
    assert DtypePair("float32", "float32").element_bytes == ElementBytes(4, 4)
    tc, pf = DecodeTCConfig(128, 2), PrefillConfig(128, False)
    # K/V of one byte halve the K/V stages (their rows widen into the merge region, no tile of their own); the
    # query rows keep the query's size
    assert (DECODE_TC.smem_bytes(tc, HALF) - DECODE_TC.smem_bytes(tc, ElementBytes(2, 1))
            == 2 * 2 * 64 * 128 * 2 - 2 * 2 * 64 * 128)
    # the prefill template stages one-byte K/V: one 16-bit K/V tile and one staging tile instead of two 16-bit
    # stages (csrc/kv_staging.cuh), whatever the configuration's stage count
    tile = 2 * 64 * 128  # K and V elements of one tile
    assert PREFILL.smem_bytes(pf, HALF) - PREFILL.smem_bytes(pf, ElementBytes(2, 1)) == 2 * 2 * tile - 3 * tile
    small = PrefillConfig(128, True)  # one stage: the staging tile comes on top
    assert PREFILL.smem_bytes(small, ElementBytes(2, 1)) - PREFILL.smem_bytes(small, HALF) == tile


def test_fit_problems_name_template_config_and_arch():
    pairs = (DtypePair("float16", "float16"),)
    assert fit_problems(arch_spec("sm_75"), ("decode", "prefill"), (128,), pairs, 8, False) == []
    assert fit_problems(arch_spec("sm_75"), ("decode",), (128,), pairs, 2, True) == [
        "decode head_dim 128 (group tile 1, key transform) needs 81920 B of shared memory, sm_75 has 65536 B",
        "decode head_dim 128 (group tile 2, key transform) needs 81920 B of shared memory, sm_75 has 65536 B"]
    assert fit_problems(arch_spec("sm_75"), ("tvm",), (256,), pairs, 1, False) == [
        "prefill head_dim 256 needs 73984 B of shared memory, sm_75 has 65536 B"]


def test_tile_header_holds_every_table():
    text = tiles_header()
    assert f"#define {HEADER_MACRO} 1" in text and "namespace tiles {" in text
    for table in ("kDecode[]", "kDecodeTC[]", "kDecodeTCStages[]", "kPrefill[]", "kPrefillWideRows = 256"):
        assert table in text
    assert "{128, 2, 2, 2, 64, 103296}," in text  # decode_tc D 128, 2 stages, 16-bit: two CTAs per SM on the H200
    assert "{128, 3, 2, 1, 64, 91264}," in text  # the same over an fp8 cache: 3 stages, two CTAs per SM
    assert "{128, 1, 3, 1}," in text  # decode_tc_stages<128, true>()


def test_cuda_build_writes_the_tile_header_and_every_unit_checks_it():
    """Without nvcc: the instantiate stage's files of a CUDA build."""
    cfg = BuildConfig("cuda", (64,), ("float16",), ("sm_80",), ("NHD",), kernels=("decode", "prefill", "tvm"))
    ctx = BuildContext(builtin("vanilla"), cfg, backend_for(cfg.target))
    for name in ("validate", "analyze", "schedule", "lower_hooks", "instantiate"):
        ctx.artifacts[name] = STAGES[name](ctx)
    files = ctx.artifacts["instantiate"]
    assert ctx.artifacts["schedule"]["templates"] == ["decode_tc", "decode", "prefill", "tvm"]
    assert files["attngen_tiles.h"] == tiles_header() and "attngen_enums.h" in files
    units = sorted(f for f in files if f.startswith("attention_"))
    assert units == ["attention_d64_f16_decode.cu", "attention_d64_f16_prefill.cu", "attention_d64_f16_tvm.cu"]
    for unit in units:
        assert '#include "tile_checks.h"' in files[unit]
    for unit, record in (("decode", "decode"), ("prefill", "prefill"), ("tvm", "tvm")):  # each its record's headers
        includes = "".join(f'#include "{h}"\n' for h in template(record).headers)
        assert includes in files[f"attention_d64_f16_{unit}.cu"]
    assert '#include "entry_decode.h"' in files["attention_d64_f16_decode.cu"]


def test_kv_dtypes_default_to_the_query_dtype_and_others_are_refused():
    cfg = BuildConfig("cuda", (128,), ("float16", "bfloat16"), ("sm_80",))
    assert cfg.kv_dtypes == cfg.dtypes
    assert cfg == BuildConfig("cuda", (128,), ("float16", "bfloat16"), ("sm_80",), kv_dtypes=("float16", "bfloat16"))
    assert cfg.dtype_pairs == (DtypePair("float16", "float16"), DtypePair("bfloat16", "bfloat16"))
    with pytest.raises(ConfigError, match=r"kv_dtypes: K/V dtype float16 with query dtype bfloat16 is not supported; "
                                          r"the cuda kernels read K/V in the query dtype"):
        BuildConfig("cuda", (128,), ("bfloat16",), ("sm_80",), kv_dtypes=("float16",))
    with pytest.raises(ConfigError, match=r"kv_dtypes \['float32'\]: give one K/V dtype per query dtype"):
        BuildConfig("cpu", (64,), ("float32", "float16"), kv_dtypes=("float32",))


def test_symbols_carry_the_kv_dtype_only_when_it_differs():
    assert symbol("batch_decode_paged_nhd", "bfloat16", 128) == "batch_decode_paged_nhd_bf16_d128"
    assert symbol("batch_decode_paged_nhd", "bfloat16", 128, "bfloat16") == "batch_decode_paged_nhd_bf16_d128"
    assert symbol("batch_decode_paged_nhd", "bfloat16", 128, "float16") == "batch_decode_paged_nhd_bf16_kvf16_d128"
    assert DtypePair("float16", "float32").short == "f16_kvf32"


def test_runtime_planner_reads_the_decode_tc_record(monkeypatch):
    h200_per_sm, h200_optin = 228 * 1024, 227 * 1024
    assert [decode_plan.decode_tc_stages(d) for d in (64, 128, 256)] == [4, 2, 1]
    # D 256: the warps merge in a stage and the query tiles hold 8 rows, so two one-stage CTAs fit an SM
    assert [decode_plan.decode_tc_ctas_per_sm(d, h200_per_sm, h200_optin) for d in (64, 128, 256)] == [2, 2, 2]
    # 8 query rows of 264 elements, four warps' fp32 scratch rows, states and row lse (288 B), aligned to 128 B;
    # then one stage of 64 key and 64 value rows
    head = -(-(8 * 264 * 2 + 4 * 2 * 256 * 4 + 288) // 128) * 128
    assert DECODE_TC.smem_bytes(DecodeTCConfig(256, 1), HALF) == head + 64 * 256 * 2 * 2 < h200_per_sm // 2 - 1024
    assert decode_plan.decode_tc_stage_order(1) == [1]
    # an fp8 cache: deeper stages of half the bytes at D 64 / 128, at the same CTAs per SM (the planner must not
    # count the 16-bit figures for it: it would plan twice the CTAs that fit); one stage and two CTAs at D 256
    assert [decode_plan.decode_tc_stages(d, 1) for d in (64, 128, 256)] == [7, 3, 1]
    assert [decode_plan.decode_tc_ctas_per_sm(d, h200_per_sm, h200_optin, 1) for d in (64, 128, 256)] == [2, 2, 2]
    assert decode_plan.decode_tc_stage_order(4) == [4, 2, 1] and decode_plan.decode_tc_stage_order(2) == [2, 1]
    assert decode_plan.decode_tc_fits(128, DECODE_TC.smem_bytes(DecodeTCConfig(128, 1), HALF))
    assert not decode_plan.decode_tc_fits(128, DECODE_TC.smem_bytes(DecodeTCConfig(128, 1), HALF) - 1)
    # a different choice in the record is what the planner sees
    from attngen.schedules import template_decode_tc

    monkeypatch.setitem(template_decode_tc.STAGES, 128, 1)
    assert decode_plan.decode_tc_stages(128) == 1
    assert decode_plan.decode_tc_ctas_per_sm(128, h200_per_sm, h200_optin) == 3


def test_hopper_prefill_is_a_companion_of_prefill_on_sm90a_only():
    from attngen.schedules.registry import companion_macros, companions, every_arch_macros
    from attngen.schedules.template_prefill_hopper import PREFILL_HOPPER, HopperConfig, hopper_smem_bytes

    assert "prefill_hopper" in PREFILL.companions and not PREFILL_HOPPER.selectable
    assert [r.name for r in companions(arch_spec("sm_90a"), ("prefill",))] == ["prefill_hopper"]
    assert companions(arch_spec("sm_80"), ("prefill",)) == [] and companions(arch_spec("sm_90a"), ("decode",)) == []
    assert companion_macros([arch_spec("sm_80"), arch_spec("sm_90a")], ("prefill",)) == ["ATTNGEN_WITH_PREFILL_HOPPER"]
    assert companion_macros([arch_spec("sm_80")], ("prefill",)) == []
    # every arch of the build runs it (an sm_90a-only build): launchers that cannot be forced take it alone
    assert every_arch_macros([arch_spec("sm_90a")], ("tvm",)) == ["ATTNGEN_EVERY_ARCH_WITH_PREFILL_HOPPER"]
    assert every_arch_macros([arch_spec("sm_80"), arch_spec("sm_90a")], ("prefill",)) == []
    assert every_arch_macros([arch_spec("sm_90a")], ("decode",)) == []
    # a build that has the companion fits its tiles too; every Hopper tile fits sm_90a's shared memory
    for d in PREFILL_HOPPER.head_dims:
        assert hopper_smem_bytes(HopperConfig(d), HALF) <= arch_spec("sm_90a").smem_per_block
    # the wide tilings (176 keys and one query buffer at head_dim 128, 192 keys and two at 64), none at 256, all
    # within sm_90a's shared memory
    assert [c.keys for c in PREFILL_HOPPER.configs(128)] == [128, 176]
    assert [c.q_buffers for c in PREFILL_HOPPER.configs(128)] == [2, 1]
    assert [(c.keys, c.q_buffers, c.stages) for c in PREFILL_HOPPER.configs(64)] == [(128, 2, 3), (192, 2, 3)]
    assert all(not c.wide for c in PREFILL_HOPPER.configs(256))
    for d in (64, 128):
        assert hopper_smem_bytes(HopperConfig(d, wide=True), HALF) <= arch_spec("sm_90a").smem_per_block
    small = dataclasses.replace(arch_spec("sm_90a"), smem_per_block=100 * 1024)
    problems = fit_problems(small, ("prefill",), (128,), (DtypePair("float16", "float16"),), 8, False)
    assert any("prefill_hopper head_dim 128 (Hopper tile)" in p for p in problems)
    assert "kPrefillHopper" in tiles_header()


def test_wgmma_header_is_the_generators_output():
    from attngen.codegen.wgmma_ops_gen import HEADER, header_text

    assert HEADER.read_text() == header_text(), "run python -m attngen.codegen.wgmma_ops_gen"


def test_masks_that_are_their_bounds_get_wide_tiles_for_long_rows():
    from attngen.schedules.template_prefill_hopper import hopper_wide_for_long_rows

    # exact masks; not an arbitrary mask (tile maps keep 128 keys), not key transforms, not maskless variants
    # (wide everywhere already: hopper_config_for); head dims 64 and 128, not 256
    for d in (64, 128):
        wide = {n for n in BUILTINS if hopper_wide_for_long_rows(builtin(n), d)}
        assert wide == {"causal", "sliding_window", "sliding_window_causal"}, d
    assert not hopper_wide_for_long_rows(builtin("causal"), 256)
    assert not hopper_wide_for_long_rows(builtin("causal"), 128, kv_scaled=True)
