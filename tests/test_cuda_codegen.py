"""Hook lowering to CUDA: the generated device code compiles with nvcc for every target arch."""
import subprocess
import tempfile
from pathlib import Path

import pytest
from tvm.script import tirx as T

from attngen import Variant

from attngen.codegen.hooks_cuda import hook_symbol, lower_hooks_cuda
from attngen.codegen.pipeline import run_pipeline
from attngen.ir import ConfigError
from attngen.schedules import ARCHS, BuildConfig
from attngen.variants import BUILTINS, builtin

from .conftest import requires_nvcc

ALL_ARCHS = tuple(ARCHS)  # sm_75, sm_80, sm_86, sm_89, sm_90a


def test_hooks_become_device_functions_with_tvm_math():
    hs = lower_hooks_cuda(builtin("logits_softcap"), 128, "sm_80")
    sym = hook_symbol("logits_softcap", 128, "logits_transform")
    assert f"ATTNGEN_HOOK void {sym}(float s, int batch, int qo_pos, int kv_pos, int qo_head, int kv_head, " \
           "float soft_cap, float* ret_ptr)" in hs.code
    assert "__tanhf(__fdividef(s, soft_cap))" in hs.code  # hardware tanh unless asked for precise
    assert "#define ATTNGEN_HOOK static __device__ __forceinline__" in hs.code


def test_row_hooks_are_specialised_to_the_head_dim():
    hs = lower_hooks_cuda(builtin("rope"), 64, "sm_90a")
    assert "for (int i = 0; i < 64; ++i)" in hs.code
    assert "float* " in hs.code and set(hs.functions) == {"query_transform", "key_transform"}
    # each element depends only on its index: a per-element form exists for both transforms
    assert set(hs.elementwise) == {"query_transform", "key_transform"}
    assert f"{hs.elementwise['key_transform']}(float* x_ptr, int i, int kv_pos, int kv_head, float rope_scale, " \
           "float rope_theta, float* ret_ptr)" in hs.code


def test_mask_bounds_are_lowered_for_tile_skipping():
    hs = lower_hooks_cuda(builtin("sliding_window_causal"), 128, "sm_80")
    assert set(hs.bounds) == {"lower", "upper"}
    sym, names = hs.bounds["upper"]
    assert names == ["window_left"] and f"{sym}(int window_left, int* ret_ptr)" in hs.code
    assert lower_hooks_cuda(builtin("custom_mask"), 128, "sm_80").bounds == {}


def test_fixed_row_length_mismatch_is_refused_at_build_time():
    @T.prim_func
    def q(x: T.Buffer((64,), "float32"), y: T.Buffer((64,), "float32"), qo_pos: T.int32, qo_head: T.int32):
        for i in range(64):
            y[i] = x[i]

    v = Variant("fixed64", query_transform=q)
    with pytest.raises(ConfigError, match=r"rows are fixed to 64 elements but head_dim=128"):
        lower_hooks_cuda(v, 128, "sm_80")


@requires_nvcc
def test_every_builtin_compiles_for_every_arch(build_cache):
    """Every built-in's hook objects compile, each on one arch family in turn (every family gets several), and
    lower to the same code on every arch, so each compiles wherever one does; "rope" (two hooks) on every family
    at once, one object per arch."""
    for i, name in enumerate(BUILTINS):
        v = builtin(name)
        for d in (64, 128):
            code = lower_hooks_cuda(v, d, "sm_80").code
            for arch in ALL_ARCHS:
                assert lower_hooks_cuda(v, d, arch).code == code, (name, arch, d)
        archs = TEMPLATE_ARCHS if name == "rope" else (TEMPLATE_ARCHS[i % len(TEMPLATE_ARCHS)],)
        res = run_pipeline(v, BuildConfig("cuda", (64, 128), ("float16",), archs, kernels=()), cache=build_cache)
        assert [o.name for o in res.objects] == [f"hooks_{a}.o" for a in archs]
        for obj in res.objects:
            data = obj.read_bytes()
            for hook in v.hooks:
                for d in (64, 128):
                    assert hook_symbol(v.name, d, hook).encode() in data, (name, obj.name, hook)


@requires_nvcc
def test_generated_header_inlines_into_a_kernel(tmp_path):
    """The header form (forceinline) compiles inside a kernel for every arch, with real SASS."""
    hs = lower_hooks_cuda(builtin("custom_mask"), 128, "sm_80")
    (tmp_path / "hooks.cuh").write_text(hs.code)
    sym = hs.symbol("logits_mask")
    (tmp_path / "k.cu").write_text(f'''#include "hooks.cuh"
extern "C" __global__ void probe(const unsigned char* bits, const int* off, const int* stride, int* out) {{
  bool visible;
  {sym}(0, 3, threadIdx.x, 0, 0, (unsigned char*)bits, (int*)off, (int*)stride, &visible);
  out[threadIdx.x] = visible;
}}
''')
    for arch in ALL_ARCHS:
        sm = arch[3:]
        p = subprocess.run(["nvcc", "-cubin", f"-gencode=arch=compute_{sm},code=sm_{sm}", "-o",
                            str(tmp_path / f"k_{arch}.cubin"), str(tmp_path / "k.cu")], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr


# sm_86 and sm_89 compile sm_80's template code with the same configurations (a configuration that does not
# fit an arch's shared memory refuses the build, none is dropped per arch): their hook objects compile in
# test_every_builtin_compiles_for_every_arch, their fp8 paths in tests/test_fp8_cuda_build.py
TEMPLATE_ARCHS = ("sm_75", "sm_80", "sm_90a")


@requires_nvcc
def test_cuda_library_compiles_for_every_arch(build_cache, tmp_path):
    """The decode and prefill templates, for variants covering every hook kind, on every arch family (device
    code alone, link="check"; the full library of an sm_80 build, its exports and static CUDA runtime, are
    tests/test_cuda_api_checks.py's). The sweep's sm_90a member, rope at head_dim 64, is
    test_gpu_test_instantiations_compile[rope-64-bfloat16]."""
    from .row_hook_variants import make

    before_hopper = TEMPLATE_ARCHS[:2]
    check = run_pipeline(builtin("rope"), BuildConfig("cuda", (64,), ("float16",), before_hopper, layouts=("NHD",),
                                                      link="check"), cache=build_cache)
    assert check.manifest["cubins"] == [f"attention_d64_f16_{k}_{a}.cubin" for k in ("decode", "prefill")
                                        for a in before_hopper]
    assert check.library is None
    from attngen.runtime import CUDAAttention

    with pytest.raises(ValueError, match=r"the build has no library to load .*link='check'"):
        CUDAAttention(builtin("rope"), check.library, check.manifest)
    rows = run_pipeline(make(), BuildConfig("cuda", (128,), ("bfloat16",), ("sm_90a",), layouts=("NHD",),
                                            link="check"), cache=build_cache)
    assert rows.manifest["cubins"] == [f"attention_d128_bf16_{k}_sm_90a.cubin" for k in ("decode", "prefill")]
    res = run_pipeline(make(), BuildConfig("cuda", (128,), ("bfloat16",), ("sm_80",), layouts=("NHD",),
                                           link="check"), cache=build_cache)
    assert res.manifest["cubins"] == [f"attention_d128_bf16_{k}_sm_80.cubin" for k in ("decode", "prefill")]
    with pytest.raises(ConfigError, match=r"link='check' is for cuda builds"):
        BuildConfig("cpu", (64,), ("float32",), link="check")


def test_shared_memory_overflow_is_refused_at_build_time(build_cache):
    with pytest.raises(ConfigError, match=r"decode head_dim 128 \(group tile 1, key transform\) needs 81920 B .* sm_75 "
                                          r"has 65536 B"):
        run_pipeline(builtin("rope"), BuildConfig("cuda", (128,), ("float16",), ("sm_75",)), cache=build_cache)
    with pytest.raises(ConfigError, match=r"prefill head_dim 256 needs 73984 B of shared memory, sm_75 has 65536 B"):
        run_pipeline(builtin("vanilla"), BuildConfig("cuda", (256,), ("float16",), ("sm_75",)), cache=build_cache)


def run_host_program(src):
    """Compiles `src` (a .cu file including attngen's csrc headers) for the host with nvcc, runs it and
    returns its standard output."""
    from attngen.codegen.cuda_library import CSRC

    exe = src.with_suffix("")
    subprocess.run(["nvcc", "-std=c++17", f"-I{CSRC}", str(src), "-o", str(exe)], check=True, capture_output=True)
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def compile_tile_checks(directory, header: str):
    """nvcc (host and sm_80 device passes) of a translation unit that includes csrc/tile_checks.h beside
    ``header`` as attngen_tiles.h, as every TU of a build does; the finished process."""
    from attngen.codegen.cuda_library import CSRC

    (directory / "attngen_tiles.h").write_text(header)
    (directory / "t.cu").write_text('#include "tile_checks.h"\n')
    return subprocess.run(["nvcc", "-std=c++17", "-c", "-gencode=arch=compute_80,code=sm_80", "--expt-relaxed-constexpr",
                           f"-I{CSRC}", f"-I{directory}", str(directory / "t.cu"), "-o", str(directory / "t.o")],
                          capture_output=True, text=True)


@requires_nvcc
def test_build_refuses_a_tile_table_the_templates_disagree_with(tmp_path, monkeypatch):
    """The templates static_assert their tiles and shared memory against the records' generated table
    (attngen_tiles.h): the records' own table compiles; a record whose stage choice or shared-memory
    function is off fails the build on the assertion that names it."""
    from attngen.schedules import template_decode_tc, template_prefill
    from attngen.schedules.tile_header import tiles_header

    ok = compile_tile_checks(tmp_path, tiles_header())
    assert ok.returncode == 0, ok.stderr
    monkeypatch.setitem(template_decode_tc.STAGES, 128, 3)
    wrong = compile_tile_checks(tmp_path, tiles_header())
    assert wrong.returncode != 0 and "decode_tc_stages<D, kFp8>() differs from the decode_tc record" in wrong.stderr
    monkeypatch.undo()
    monkeypatch.setitem(template_decode_tc.FP8_STAGES, 128, 2)  # the fp8 rows are checked too
    wrong = compile_tile_checks(tmp_path, tiles_header())
    assert wrong.returncode != 0 and "decode_tc_stages<D, kFp8>() differs from the decode_tc record" in wrong.stderr
    monkeypatch.undo()
    monkeypatch.setattr(template_prefill, "ROW_PAD", 0)  # a shared-memory function that forgets the padding
    wrong = compile_tile_checks(tmp_path, tiles_header())
    assert wrong.returncode != 0 and "prefill_smem_bytes differs from the prefill record" in wrong.stderr


def test_cuda_config_rejections():
    with pytest.raises(ConfigError, match=r"dtype bfloat16 is not supported on sm_75.*Turing"):
        BuildConfig("cuda", (128,), ("bfloat16",), ("sm_75",))
    with pytest.raises(ConfigError, match=r"head_dim 96 is not supported by the CUDA templates"):
        BuildConfig("cuda", (96,), ("float16",), ("sm_80",))
    with pytest.raises(ConfigError, match=r"unknown arch 'sm_70'"):
        BuildConfig("cuda", (128,), ("float16",), ("sm_70",))
    with pytest.raises(ConfigError, match=r"needs at least one arch"):
        BuildConfig("cuda", (128,), ("float16",))
    assert BuildConfig("cuda", (128,), ("float16",), ("sm_90",)).archs == ("sm_90a",)


@requires_nvcc
def test_merge_and_planner_libraries_build(build_cache):
    import tvm_ffi

    from attngen.codegen.host_library import build_merge_cuda_library, build_planner_library

    lib = build_merge_cuda_library(TEMPLATE_ARCHS, build_cache)  # one arch per family (its code branches at 80, 90)
    data = lib.read_bytes()
    for kind in ("merge_states", "merge_states_sum", "merge_state_inplace"):
        for dt in ("f32", "f16", "bf16"):
            assert f"__tvm_ffi_{kind}_{dt}".encode() in data
    assert callable(tvm_ffi.load_module(str(build_planner_library(build_cache)))["plan_split_kv"])


def test_build_cores_come_from_the_environment_or_the_machine(monkeypatch):
    import os

    from attngen.codegen.nvcc import NvccError, build_cores

    monkeypatch.delenv("ATTNGEN_BUILD_CORES", raising=False)
    assert build_cores() == (os.cpu_count() or 1)
    monkeypatch.setenv("ATTNGEN_BUILD_CORES", "3")
    assert build_cores() == 3
    monkeypatch.setenv("ATTNGEN_BUILD_CORES", "0")
    assert build_cores() == 1
    monkeypatch.setenv("ATTNGEN_BUILD_CORES", "many")
    with pytest.raises(NvccError, match="ATTNGEN_BUILD_CORES='many': give a whole number of cores"):
        build_cores()


@requires_nvcc
def test_nvccs_own_threads_leave_the_code_as_it_was(tmp_path):
    """run_jobs gives each job its share of the cores as nvcc threads (--threads across archs, --split-compile
    across kernels); the machine code of every kernel is byte for byte a serial compile's (so the flags stay out
    of cache keys), here on merge_states.cu's nine kernels for two archs."""
    import tvm_ffi.libinfo as li

    from attngen.codegen import nvcc
    from attngen.codegen.host_library import CSRC
    from attngen.codegen.linked_cubin import cubin_code
    from attngen.codegen.nvcc import NvccJob, thread_flags

    two_archs = ("-gencode=arch=compute_90a,code=sm_90a",)
    job = NvccJob(CSRC / "merge_states.cu", tmp_path / "x", "-gencode=arch=compute_80,code=sm_80", two_archs)
    assert thread_flags(job, 1) == ()
    assert thread_flags(job, 2) == ("--threads=2",)
    assert thread_flags(job, 16) == ("--threads=2", "--split-compile=8")
    one_arch = NvccJob(job.source, job.output, job.gencode, mode="-cubin")
    assert thread_flags(one_arch, 3) == ("--split-compile=3",)
    code = []
    for cores in (1, 2):
        out = tmp_path / f"merge_{cores}.cubin"
        includes = (f"-I{CSRC}", f"-I{li.find_include_path()}", f"-I{li.find_dlpack_include_path()}")
        cmd = NvccJob(job.source, out, job.gencode, includes, mode="-cubin").command(nvcc.require_nvcc(), cores)
        assert ("--split-compile=2" in cmd) == (cores == 2)
        subprocess.run(cmd, check=True, capture_output=True)
        code.append(cubin_code(out.read_bytes()))
    assert len(code[0]) == 9 and code[0] == code[1]


# Every built-in at head_dim 128 / bf16 (its hooks in every template code path), and for the plain variant
# and the row-hook one every head dim (what differs per head dim: tiles, shared memory, the row hooks'
# scratch at 256), each dtype at some head dim of each (the GPU suite builds tests/test_gpu_decode.py's
# VARIANT_CONFIGS on the device).
EXTRA_CONFIGS = {"vanilla": [(64, "float16"), (256, "bfloat16")], "rope": [(64, "bfloat16"), (256, "float16")]}
INSTANTIATIONS = [(name, 128, "bfloat16") for name in BUILTINS] + [
    (name, d, dt) for name, configs in EXTRA_CONFIGS.items() for d, dt in configs]


@requires_nvcc
@pytest.mark.parametrize("name,head_dim,dtype", INSTANTIATIONS)
def test_gpu_test_instantiations_compile(name, head_dim, dtype, build_cache):
    """The GPU tests' kernels (decode and prefill, both layouts) compile for sm_90a, the GPU they run on:
    device code only (link="check"; the host entries compile in the full builds of the other tests)."""
    res = run_pipeline(builtin(name), BuildConfig("cuda", (head_dim,), (dtype,), ("sm_90a",), link="check"),
                       cache=build_cache)
    assert res.library is None
    dt = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    assert res.manifest["cubins"] == [f"attention_d{head_dim}_{dt}_{k}_sm_90a.cubin" for k in ("decode", "prefill")]
    for cubin in res.manifest["cubins"]:
        data = (res.directory / cubin).read_bytes()
        assert data[:4] == b"\x7fELF" and (b"hopper_prefill_kernel" in data or "decode" in cubin)


@requires_nvcc
@pytest.mark.parametrize("name,cfg", [
    ("custom_mask", BuildConfig("cuda", (128,), ("bfloat16",), ("sm_90a",), link="check")),  # an instantiation above
    ("rope", BuildConfig("cuda", (64, 256), ("bfloat16",), ("sm_90a",), kernels=("prefill",), link="check",
                         kv_dtypes=("float8_e5m2",)))])  # tests/test_fp8_cuda_prefill.py's sm_90a hook paths
def test_split_units_compile_to_the_unsplit_units_kernels(name, cfg, build_cache):
    """The decode and prefill units' device pass sees the launchers' explicit instances instead of the host glue
    (cuda_library.translation_units): every kernel's machine code is byte for byte that of the unit unsplit."""
    from attngen.codegen import nvcc
    from attngen.codegen.cuda_library import _tu_flags, translation_units
    from attngen.codegen.linked_cubin import cubin_code
    from attngen.schedules.arch import arch_spec

    res = run_pipeline(builtin(name), cfg, cache=build_cache)  # split units (a cache hit after the tests above)
    d, pair = cfg.head_dims[0], cfg.dtype_pairs[0]
    split = translation_units(builtin(name), cfg, d, pair)
    unsplit = translation_units(builtin(name), cfg, d, pair, split=False)
    for unit, text in unsplit.items():
        assert "#ifdef __CUDA_ARCH__" in split[unit] and "#ifdef __CUDA_ARCH__" not in text
        device = split[unit].split("#ifdef __CUDA_ARCH__")[1].split("#else")[0]
        assert "template " in device and "problem_glue.h" not in device and "EXPORT" not in device
        out = Path(res.directory)
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / unit
            src.write_text(text)
            cubin = Path(tmp) / "unsplit.cubin"
            nvcc.run_jobs([nvcc.NvccJob(src, cubin, arch_spec("sm_90a").gencode, _tu_flags(out, cfg),
                                        mode="-cubin")])
            whole = cubin_code(cubin.read_bytes())
        kept = cubin_code((out / f"{Path(unit).stem}_sm_90a.cubin").read_bytes())
        assert whole and kept == whole, unit


@requires_nvcc
def test_tvm_slot_library_builds_and_refuses(build_cache):
    """kernels=("tvm",): the TVM-convention functions per (head_dim, dtype) ("tirx" and "flashinfer"), scalar parameters compiled
    in (device code alone here, link="check": the whole slot libraries are built by the tests/test_tvm_kv_cache_cuda_*
    tests); variants TVM's cache would get silently wrong are refused at build time."""
    from attngen.codegen.cuda_library import exported_functions

    cfg = BuildConfig("cuda", (128,), ("float16",), ("sm_90a",), ("HND",), kernels=("tvm",),
                      tvm_constants=(("soft_cap", 30.0),), link="check")
    assert exported_functions(cfg) == sorted(
        ["tvm_decode_f16_d128", "tvm_prefill_paged_f16_d128", "tvm_prefill_ragged_f16_d128",
         "tvm_decode_sliding_window_f16_d128", "tvm_prefill_paged_sliding_window_f16_d128",
         "tvm_prefill_ragged_tree_f16_d128", "tvm_prefill_paged_tree_f16_d128"]
        + [f"tvm_fi_{k}_f16_d128" for k in ("decode_plan", "decode_run", "prefill_plan", "prefill_paged_run",
                                            "prefill_ragged_run")])
    res = run_pipeline(builtin("logits_softcap"), cfg, cache=build_cache)
    assert res.library is None and res.manifest["cubins"] == ["attention_d128_f16_tvm_sm_90a.cubin"]
    assert b"hopper_prefill_kernel" in (res.directory / res.manifest["cubins"][0]).read_bytes()
    src = (res.directory / "attention_d128_f16_tvm.cu").read_text()
    assert "attngen_gen::Hooks_d128::set_params(entry, hp, 0x1.e000000000000p+4);" in src
    assert "using TensorArgs = attngen::ArgList<>;" in src  # no tensor parameters: TVM's argument lists exactly
    for name, why in [("sigmoid", "unnormalised sum"), ("alibi", r"reads \['kv_pos', 'qo_pos'\]"),
                      ("attention_sink", "output_transform"), ("rope", r"reads \['qo_pos'\]")]:
        with pytest.raises(ConfigError, match=why):
            run_pipeline(builtin(name), BuildConfig("cuda", (128,), ("float16",), ("sm_90a",), kernels=("tvm",)),
                         cache=build_cache)
    with pytest.raises(ConfigError, match=r"tvm_constants: \['bogus'\] are not parameters"):
        run_pipeline(builtin("vanilla"), BuildConfig("cuda", (128,), ("float16",), ("sm_90a",), kernels=("tvm",),
                                                     tvm_constants=(("bogus", 1),)), cache=build_cache)


@requires_nvcc
def test_kv_tile_layout_is_a_line_preserving_conflict_free_permutation(tmp_path):
    """kv_tile_at (the swizzled K/V tile rows of the decode and prefill templates): within a row it permutes
    whole 16-byte chunks; the 8 chunks of one 128-byte global line land in one aligned 128-byte line of
    shared memory (one L2 request per line copied); 8 consecutive rows of one chunk column (an ldmatrix
    8x8) hit 8 distinct 16-byte bank groups."""
    src = tmp_path / "layout.cu"
    src.write_text("""#include <cstdio>
#include "kv_tile_layout.cuh"
template <int D> void dump() {
  for (int r = 0; r < 24; ++r)
    for (int c = 0; c < D; ++c) printf("%d %d %d %d\\n", D, r, c, attngen::kv_tile_at<D>(r, c));
}
int main() { dump<64>(); dump<128>(); dump<256>(); }
""")
    rows = [tuple(int(x) for x in line.split()) for line in run_host_program(src).split("\n") if line.strip()]
    at = {(d, r, c): off for d, r, c, off in rows}
    for d in (64, 128, 256):
        for r in range(24):
            offs = [at[d, r, c] for c in range(d)]
            assert sorted(offs) == list(range(r * d, (r + 1) * d))  # a permutation of the row's elements
            for c in range(d):
                assert at[d, r, c] == at[d, r, c - c % 8] + c % 8  # whole chunks move
            for c0 in range(0, d, 64):  # one 128-byte line of 2-byte elements
                assert len({at[d, r, c] * 2 // 128 for c in range(c0, c0 + 64)}) == 1
        for c in range(0, d, 8):
            for r0 in (0, 8, 16):
                banks = {at[d, r, c] * 2 // 16 % 8 for r in range(r0, r0 + 8)}
                assert len(banks) == 8, (d, c, r0)
