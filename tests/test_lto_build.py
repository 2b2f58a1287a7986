"""Link-time CUDA builds (BuildConfig.link="lto", attngen/codegen/lto.py): template objects cached per hook
signature, host glue per parameter list, a variant's hooks linked in by nvJitLink and inlined; over fp8 K/V
caches too (template objects of the cache's type, the fp8 entries)."""
import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest
from tvm.script import tirx as T

from attngen.build import build
from attngen.codegen import linked_cubin, lto, nvjitlink, nvrtc
from attngen.codegen.cache import entry_is_sealed
from attngen.codegen.cuda_library import exported_functions
from attngen.codegen.cuda_variant import abi_hooks_source, abi_traits_source, linked_params_source, traits_parts
from attngen.codegen.hooks_cuda import lower_hooks_cuda
from attngen.ir import ConfigError, ScalarParam, Variant
from attngen.schedules import BuildConfig
from attngen.schedules.arch import smem_floor_define, smem_optin_floor
from attngen.schedules.dtypes import DtypePair
from attngen.variants import BUILTINS, builtin

from .conftest import requires_nvcc
from .test_tile_map import example

requires_nvjitlink = pytest.mark.skipif(not nvjitlink.available(), reason="libnvJitLink (cuda-bindings, "
                                        "nvidia-nvjitlink) is not installed")
CUOBJDUMP = shutil.which("cuobjdump") or next(
    (p for p in ("/opt/cudatools/triton/backends/nvidia/bin/cuobjdump",) if Path(p).is_file()), None)


def scaled_softcap(scale: float, name: str = "softcap_scaled") -> Variant:
    """A soft-cap whose hook body holds one constant: two scales differ only in a hook's body."""
    @T.prim_func
    def f(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
          kv_head: T.int32, cap: T.float32) -> T.float32:
        return cap * T.tanh(s / cap) * T.float32(scale)

    return Variant(name, logits_transform=f, params=[ScalarParam("cap", "float32", 30.0)])


def softcap_two_params() -> Variant:
    """The same hook signature as :func:`scaled_softcap`, another parameter list."""
    @T.prim_func
    def f(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
          kv_head: T.int32, cap: T.float32, scale: T.float32) -> T.float32:
        return cap * T.tanh(s / cap) * scale

    return Variant("softcap_two", logits_transform=f,
                   params=[ScalarParam("cap", "float32", 30.0), ScalarParam("scale", "float32", 1.0)])


def lto_config(**kw) -> BuildConfig:
    base = dict(target="cuda", head_dims=(128,), dtypes=("float16",), archs=("sm_80",), kernels=("decode",),
                link="lto")
    return BuildConfig(**{**base, **kw})


# ---- keys and configuration (no compiler) ----

def test_link_field_is_validated():
    with pytest.raises(ConfigError, match="link 'static' is not supported"):
        lto_config(link="static")
    with pytest.raises(ConfigError, match="for cuda builds"):
        BuildConfig(target="cpu", link="lto")
    # the default keeps the keys of whole-program builds as they were
    assert "link" not in BuildConfig(target="cuda", archs=("sm_80",), dtypes=("float16",)).key()
    assert '"link": "lto"' in lto_config().key()


def test_lto_refuses_templates_without_a_launcher_record():
    with pytest.raises(ConfigError, match="need link='whole'"):
        lto.check_config(lto_config(kernels=("tvm",)))


def test_template_key_depends_on_the_hook_signature_only():
    d, pair, cfg = 128, DtypePair("float16", "float16"), lto_config()

    def abi(v):
        return abi_traits_source(v, lower_hooks_cuda(v, d, "sm_80"), d)

    def key(v):
        return lto.template_key("decode", "sm_80", d, pair, cfg, abi(v))

    a, b = scaled_softcap(1.0), scaled_softcap(2.0)
    assert abi(a) == abi(b) and key(a) == key(b)  # a hook body's constant
    assert key(scaled_softcap(1.0, name="other")) == key(a)  # another variant, same signature
    assert key(softcap_two_params()) == key(a)  # another parameter list, same signature
    assert key(builtin("logits_softcap")) == key(a)
    # ALiBi's logits hook has three row terms, the soft-cap's two: both round up to the same count, and its
    # affine form (read by the prefill templates alone) leaves the decode template shared
    assert key(builtin("alibi")) == key(a)
    assert "kLogitsRowTerms = 4;" in abi(builtin("alibi")) and "kLogitsAffine = true;" in abi(builtin("alibi"))
    prefill_key = lambda v: lto.template_key("prefill", "sm_80", d, pair, cfg, abi(v))  # noqa: E731
    assert prefill_key(builtin("alibi")) != prefill_key(a)
    assert prefill_key(scaled_softcap(2.0, name="other")) == prefill_key(a)
    assert "kLogitsRowTerms = 0;" in abi(builtin("causal"))  # no logits hook: no row terms
    assert key(builtin("causal")) != key(a)  # a mask instead of a logits transform
    assert key(builtin("sigmoid")) != key(a)  # another state algebra
    assert lto.template_key("decode", "sm_90a", d, pair, cfg, abi(a)) != key(a)
    assert lto.template_key("decode", "sm_80", 64, pair, cfg, abi(a)) != key(a)
    assert lto.template_key("prefill", "sm_80", d, pair, cfg, abi(a)) != key(a)


def test_host_glue_depends_on_the_parameter_list_not_the_hook_body():
    cfg = lto_config(kernels=("decode", "prefill"))

    def exports(v):
        return lto.exports_source(v, cfg, {128: linked_params_source(v, lower_hooks_cuda(v, 128, "sm_80"), 128)})

    assert exports(scaled_softcap(1.0)) == exports(scaled_softcap(2.0))
    assert exports(softcap_two_params()) != exports(scaled_softcap(1.0))
    assert "attngen::pack_params(block, p)" in exports(builtin("alibi"))
    # the launch object depends on neither: only on the build's shape (and the signature, in its key)
    assert "soft" not in lto.launch_source(cfg, 128) and "cap" not in lto.launch_source(cfg, 128)
    names = [e.name for pair in cfg.dtype_pairs for e in lto.linked_exports(cfg, 128, pair)]
    assert sorted(names) == exported_functions(cfg)


def test_parameter_block_bound():
    from attngen.codegen.cuda_variant import params_bytes
    from attngen.ir import TensorParam

    hs = lower_hooks_cuda(builtin("alibi"), 128, "sm_80")
    assert params_bytes(builtin("alibi"), hs.dims or {}) == 8  # one pointer
    assert params_bytes(scaled_softcap(1.0), {}) == 4
    lto.check_params_fit(builtin("alibi"), hs)
    many = Variant("many", logits_transform=builtin("alibi").hooks["logits_transform"],
                   params=[*builtin("alibi").params, *(TensorParam(f"t{i}", "float32", (4,)) for i in range(40))])
    with pytest.raises(ConfigError, match="more than the 256 a link-time build passes"):
        lto.check_params_fit(many, hs)
    header = (lto.CSRC / "hook_abi.h").read_text()
    assert f"constexpr int kParamBlockBytes = {lto.PARAM_BLOCK_BYTES};" in header  # the bound in both languages


def test_kernel_keys_from_demangled_names():
    assert linked_cubin.kernel_key("void attngen::decode_kernel<attngen_gen::Hooks_d128, __half, 128, 4>"
                                   "(attngen::DecodeProblem, attngen_gen::Hooks_d128::Params)") == \
        "decode_kernel<__half, 128, 4>"
    assert linked_cubin.kernel_key("void attngen::prefill_kernel<attngen_gen::Hooks_d64, __nv_bfloat16, 64, true, 1>"
                          "(attngen::PrefillProblem, attngen_gen::Hooks_d64::Params)") == \
        "prefill_kernel<__nv_bfloat16, 64, true, 1>"


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC (cuda-bindings, nvidia-cuda-nvrtc) is not installed")
@pytest.mark.parametrize("name", list(BUILTINS))
def test_both_sides_of_the_hook_abi_compile(name):
    """Every built-in's hook object and ABI traits, in one NVRTC program whose kernel calls every
    forwarding function: the extern declarations and definitions agree."""
    v, d = builtin(name), 128
    hs = lower_hooks_cuda(v, d, "sm_80")
    _, fns = traits_parts(v, hs, d)
    args = {"float*": "row", "int*": "(int*)row", "int": "1", "float": "0.5f", "bool": "true"}
    calls = []
    for f in fns:
        params = [x.strip().rsplit(" ", 1)[0] for x in f.decl.split(",") if x.strip()]
        calls.append(f"sink += (float)H::{f.member}(p{''.join(', ' + args[t] for t in params)});"
                     if f.returns != "void" else f"H::{f.member}(p{''.join(', ' + args[t] for t in params)});")
    src = "\n".join([hs.code, abi_hooks_source(v, hs, d), abi_traits_source(v, hs, d),
                     "using H = attngen_gen::Hooks_d128;",
                     "extern \"C\" __global__ void probe(H::Params p, float* row, float* out) {",
                     "  float sink = 0.f;", *calls, "  out[0] = sink;", "}"])
    lto.compile_hooks_source_check(src)


# ---- builds ----

@pytest.fixture(scope="module")
def lto_cache(tmp_path_factory):
    """A fresh cache: :func:`edited_builds` counts the pieces its first build compiles there."""
    from attngen.codegen.cache import BuildCache

    return BuildCache(tmp_path_factory.mktemp("lto_cache"))


@pytest.fixture(scope="module")
def edited_builds(lto_cache):
    """A variant built linked, then rebuilt after a one-constant edit of its hook, in a fresh cache."""
    cfg = lto_config()
    before = dict(lto.stats)
    first = build(scaled_softcap(1.0), cfg, cache=lto_cache)
    mid = dict(lto.stats)
    second = build(scaled_softcap(2.0), cfg, cache=lto_cache)
    after = dict(lto.stats)
    third = build(softcap_two_params(), cfg, cache=lto_cache)
    return first, second, before, mid, after, third


def _delta(a: dict, b: dict, k: str) -> int:
    return b.get(k, 0) - a.get(k, 0)


@requires_nvcc
@requires_nvjitlink
def test_one_constant_edit_reuses_template_and_glue(edited_builds):
    first, second, before, mid, after, _ = edited_builds
    assert not first.cache_hit and not second.cache_hit
    built = ("template_built", "launch_built", "exports_built")
    assert [_delta(before, mid, k) for k in built] == [2, 1, 1]  # decode: its two parts
    assert [_delta(mid, after, k) for k in built] == [0, 0, 0]  # the edit compiled only the hooks
    assert [_delta(mid, after, k) for k in ("template_reused", "launch_reused", "exports_reused")] == [2, 1, 1]
    assert second.manifest["lto_reused"] == {"templates": [True, True], "launch": [True], "exports": True}
    assert first.manifest["link"] == "lto" and second.manifest["functions"] == first.manifest["functions"]
    for name in first.manifest["cubins"]:
        assert (first.directory / name).read_bytes() != (second.directory / name).read_bytes()  # edit reached


@requires_nvcc
@requires_nvjitlink
def test_new_parameter_list_compiles_only_the_exports(edited_builds):
    third = edited_builds[-1]
    assert third.manifest["lto_reused"] == {"templates": [True, True], "launch": [True], "exports": False}


@requires_nvcc
@requires_nvjitlink
def test_linked_library_exports_the_entries_and_embeds_the_kernels(edited_builds):
    res = edited_builds[0]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(res.library)], capture_output=True, text=True).stdout
    for fn in res.manifest["functions"]:
        assert f"__tvm_ffi_{fn}" in syms
    assert "attngen_linked_kernels" not in syms  # each library keeps its table to itself
    # the decode kernels' last argument is the K/V element type (the query's here)
    assert res.manifest["kernels"] == ["decode_kernel<__half, 128, 1, __half>", "decode_kernel<__half, 128, 2, __half>",
                                       "decode_kernel<__half, 128, 4, __half>", "decode_kernel<__half, 128, 8, __half>",
                                       "decode_tc_kernel<__half, 128, 1, __half>",
                                       "decode_tc_kernel<__half, 128, 2, __half>",
                                       "merge_decode_kernel<__half, 128>"]
    held = [linked_cubin.cubin_kernels((res.directory / c).read_bytes()) for c in res.manifest["cubins"]]
    assert [len(h) for h in held] == [4, 3]  # CUDA-core kernels; tensor-core kernels and the merge


@requires_nvcc
@requires_nvjitlink
def test_linked_library_loads_and_checks_arguments_like_a_whole_one(edited_builds):
    """On the CPU: the exports reach the entry templates' checks through the launch object (the call is
    refused before any CUDA call), typed and named as a whole-program build's."""
    import torch
    import tvm_ffi

    res = edited_builds[0]
    f = tvm_ffi.load_module(str(res.library))["batch_decode_paged_nhd_f16_d128"]
    q = torch.zeros(2, 8, 128, dtype=torch.bfloat16)
    pages = torch.zeros(4, 2, 16, 2, 128, dtype=torch.float16)
    i32 = torch.zeros(3, dtype=torch.int32)
    own = (q, pages, i32, i32, i32, torch.zeros(2, 8, 128, dtype=torch.float16), torch.zeros(2, 8), 0.1,
           torch.zeros(1), torch.zeros(1), 1, 0, None, 0, 0, 1)
    with pytest.raises(TypeError, match="batch_decode_paged_nhd_f16_d128: q: expected element type float16"):
        f(*own, 30.0)
    with pytest.raises(TypeError, match=r"Mismatched number of arguments .*16: float\) -> void"):
        f(*own)


@requires_nvcc
@requires_nvjitlink
def test_hooks_are_inlined_into_the_linked_kernels(edited_builds):
    res = edited_builds[0]
    paths = [res.directory / c for c in res.manifest["cubins"]]
    for cubin in (p.read_bytes() for p in paths):
        # neither the ABI functions nor the lowered hooks survive as functions of their own
        assert b"attngen_abi_" not in cubin and b"softcap_scaled" not in cubin
    if CUOBJDUMP is None:
        pytest.skip("cuobjdump not found for the SASS check")
    kernels = []
    for cubin_path in paths:
        sass = subprocess.run([CUOBJDUMP, "-sass", str(cubin_path)], capture_output=True, text=True, check=True).stdout
        kernels += sass.split("Function : ")[1:]
        elf = subprocess.run([CUOBJDUMP, "-elf", str(cubin_path)], capture_output=True, text=True, check=True).stdout
        symtab = elf.split(".section .symtab")[1]
        functions = [line.split()[-1] for line in symtab.splitlines()
                     if len(line.split()) >= 6 and line.split()[3] in ("0x2", "0x12")]
        # CALLs only reach the CUDA math library's internal helpers (as in whole-program builds)
        assert all(f.startswith("$__internal_") for f in functions), functions
    assert len(kernels) == 7
    for k in kernels:
        name = k.split()[0]
        if "merge_decode_kernel" not in name:  # every attention kernel computes the soft-cap's tanh itself
            assert "MUFU.TANH" in k, name


@requires_nvcc
@requires_nvjitlink
def test_each_arch_gets_its_cubin(edited_builds, lto_cache):
    # the cache of edited_builds, once they have counted their pieces: its sm_80 template objects and launch
    # object serve this build's sm_80 part
    res = build(scaled_softcap(1.0), lto_config(archs=("sm_80", "sm_90a")), cache=lto_cache)
    reused = res.manifest["lto_reused"]
    assert reused["templates"][:2] == [True, True] and reused["launch"] == [True]
    # sm_90a links its CUDA-core decode kernels on first use (every tensor-core tile fits there); sm_80 code
    # also runs on GPUs of 99 KB per block, where the tensor-core tile of D 256 does not: it links them
    assert res.manifest["cubins"] == ["linked_sm_80_0.cubin", "linked_sm_80_1.cubin", "linked_sm_90a_1.cubin"]
    assert [(e["arch"], e["part"]) for e in res.manifest["deferred"]] == [("sm_90a", 0)]
    table = (res.directory / "linked_cubins.c").read_text()
    # by arch and part, for the device's pick
    assert "{attngen_cubin_0, 80, 0}, {attngen_cubin_1, 80, 1}, {attngen_cubin_2, 90, 1}, {0, 0, 0}" in table
    # the CUDA-core kernels are in the table (from sm_80's cubin) although sm_90a links them later
    assert any(k.startswith("decode_kernel<") for k in res.manifest["kernels"])


@requires_nvcc
@requires_nvjitlink
def test_each_template_object_links_into_its_own_cubin(build_cache):
    """Decode (two parts: CUDA-core kernels; tensor-core kernels and the merge) and prefill (on sm_90a the mma.sync
    kernels and the Hopper ones; the tile-map classifier's part only for variants that reach it, not soft-cap's)
    link in parallel, one cubin each, the hooks
    inlined; the kernel table names the part holding each kernel, and the launch object routes to the Hopper
    template."""
    import itertools
    import re

    res = build(scaled_softcap(1.0), lto_config(kernels=("decode", "prefill"), archs=("sm_90a",),
                                                defer_alternatives=False), cache=build_cache)
    assert res.manifest["cubins"] == [f"linked_sm_90a_{i}.cubin" for i in range(4)] and not res.manifest["deferred"]
    assert any(k.startswith("prefill_kernel<__half, 128") for k in res.manifest["kernels"])
    # K/V of the query dtype; soft-cap (no mask hook) runs 176-key tiles at every length: one tiling
    assert "hopper_prefill_kernel<__half, 128, false, __half, true, false>" in res.manifest["kernels"]
    assert "hopper_prefill_kernel<__half, 128, false, __half, false, false>" not in res.manifest["kernels"]
    for c in res.manifest["cubins"]:
        assert b"attngen_abi_" not in (res.directory / c).read_bytes()
    held = [set(linked_cubin.cubin_kernels((res.directory / c).read_bytes())) for c in res.manifest["cubins"]]
    assert all(held) and not any(a & b for a, b in itertools.combinations(held, 2))
    src = (res.directory / "linked_cubins.c").read_text()
    pairs = re.findall(r'^  "([^"]+)", "([^"]+)",$', src, re.M)
    parts = [int(x) for x in re.search(r"attngen_linked_kernel_parts\[\] = \{([^}]*)\}", src).group(1).split(",")]
    assert parts[-1] == -1 and len(parts) == len(pairs) + 1 == len(res.manifest["kernels"]) + 1
    for (key, mangled), part in zip(pairs, parts):
        assert mangled in held[part], key
        assert part == (0 if key.startswith("decode_kernel") else 3 if key.startswith("hopper")
                        else 2 if key.startswith("prefill") else 1), key
    # soft-cap has no mask and no key or query transform: no classifier, no row-hook pass (lto.part_serves; a
    # variant with them: test_linked_row_hook_pass_kernel)
    assert not any(k.startswith(("tile_", "hook_pass")) for k in res.manifest["kernels"]), res.manifest["kernels"]
    # an sm_90a-only build runs on GPUs of 227 KB shared memory per block alone: the launchers' fallbacks for
    # less (the one-stage tensor-core decode tile) are not compiled, so the links have less to generate
    kernels = res.manifest["kernels"]
    assert "decode_tc_kernel<__half, 128, 2, __half>" in kernels
    assert not any(k.startswith("decode_tc_kernel<__half, 128, 1,") for k in kernels), kernels
    sm90 = lto.launch_source(lto_config(kernels=("decode", "prefill"), archs=("sm_90a",)), 128)
    assert sm90.startswith("#define ATTNGEN_WITH_PREFILL_HOPPER 1\n#define ATTNGEN_SMEM_OPTIN_FLOOR 232448\n")
    # host code alone: nvcc's device pass parses none of it (the library links the kernels from the cubins)
    assert "\n#ifndef __CUDA_ARCH__\n" in sm90 and sm90.endswith("#endif  // __CUDA_ARCH__\n")
    sm80 = lto.launch_source(lto_config(kernels=("decode", "prefill")), 128)
    assert "ATTNGEN_WITH_PREFILL_HOPPER" not in sm80  # no sm_90a: no Hopper part, no route to it
    assert "ATTNGEN_SMEM_OPTIN_FLOOR" not in sm80  # sm_80 code also runs on sm_86 / sm_89 (99 KB): no floor


def test_the_tile_map_part_is_compiled_once_per_head_dim():
    """The classifier reads no K/V: its part is compiled with the build's first dtype pair alone (csrc/tile_map.cuh
    keys it by head dim, tile_map_kernel<128>), and never deferred; the ABI traits carry the flag it reads only
    for masks beyond their bounds, so that the flag splits no other variant's template objects."""
    prefill = lto.LAUNCHERS["prefill"]
    assert prefill.parts_of(["ATTNGEN_WITH_PREFILL_HOPPER"]) == [0, 1, 2]
    assert prefill.parts_of(["ATTNGEN_WITH_PREFILL_HOPPER"], first_pair=False) == [0, 1]
    assert prefill.parts_of([], first_pair=False) == [0]
    src = lto.template_source("prefill", 128, DtypePair("bfloat16", "bfloat16"), 8, part=2)
    assert "launch_tile_map<attngen_gen::Hooks_d128>" in src and "launch_prefill" not in src
    cfg = lto_config(kernels=("prefill",), archs=("sm_90a",))
    assert not lto.deferred_part(cfg, "sm_90a", "prefill", 2)
    # built and linked for the variants that reach it: a mask beyond its bounds, a key or query transform
    assert lto.CLASSIFIER_PART == ("prefill", 2)
    for name, reached in (("custom_mask", True), ("rope", True), ("logits_softcap", False), ("alibi", False),
                          ("causal", False), ("sliding_window", False), ("vanilla", False)):
        assert lto.part_serves(builtin(name), "prefill", 2) == reached, name
        assert lto.part_serves(builtin(name), "prefill", 1) and lto.part_serves(builtin(name), "decode", 1)
    assert lto.part_serves(example("document_mask"), "prefill", 2)
    heads = builtin("custom_mask")  # a bit mask over (batch, query head, ...): beyond its bounds
    for variant, reads in ((builtin("causal"), "false"), (builtin("vanilla"), "false")):
        abi = abi_traits_source(variant, lower_hooks_cuda(variant, 128, "sm_90a"), 128)
        assert f"kMaskReadsHeads = {reads};" in abi
    abi = abi_traits_source(heads, lower_hooks_cuda(heads, 128, "sm_90a"), 128)
    assert f"kMaskReadsHeads = {'true' if heads.analysis.mask_reads_heads else 'false'};" in abi
    assert "kMaskExact = false;" in abi


def test_smem_floor_only_for_arch_specific_targets():
    """sm_90a code runs on compute capability 9.0 alone (227 KB per block); sm_80 code also on 8.6 / 8.9."""
    assert smem_optin_floor(("sm_90a",)) == 227 * 1024
    assert smem_optin_floor(("sm_80",)) == smem_optin_floor(("sm_80", "sm_90a")) == smem_optin_floor(("sm_89",)) == 0
    assert smem_floor_define(("sm_86",)) == ""
    assert smem_floor_define(("sm_90",)) == "#define ATTNGEN_SMEM_OPTIN_FLOOR 232448"
    src = lto.template_source("decode", 128, DtypePair("float16", "float16"), 8, 1, smem_floor_define(("sm_90a",)))
    assert src.startswith("#define ATTNGEN_DECODE_KERNELS 2\n#define ATTNGEN_SMEM_OPTIN_FLOOR 232448\n")


def test_deferring_builds_give_each_hopper_kernel_one_tiling():
    """Linked builds that defer alternatives compile and link each Hopper kernel in its one tiling (a causal
    variant's 176-key tiling for long rows would add a kernel to every edit's link); whole-program builds and
    linked ones with the alternatives up front hold both (csrc/hopper_tile.cuh hopper_wide_choice)."""
    hopper = lto_config(kernels=("decode", "prefill"), archs=("sm_90a",))
    assert lto.build_defines(hopper, "prefill", 1) == "#define ATTNGEN_SMEM_OPTIN_FLOOR 232448\n" + lto.ONE_TILING_DEFINE
    assert lto.ONE_TILING_DEFINE in lto.build_defines(hopper)  # the launch object's
    # the decode's parts and the prefill's mma.sync and classifier parts stay shared with non-deferring builds
    for record, part in (("decode", 0), ("decode", 1), ("prefill", 0), ("prefill", 2)):
        assert lto.build_defines(hopper, record, part) == "#define ATTNGEN_SMEM_OPTIN_FLOOR 232448", (record, part)
    assert lto.ONE_TILING_DEFINE not in lto.build_defines(lto_config(kernels=("decode", "prefill"), archs=("sm_90a",),
                                                                     defer_alternatives=False))
    assert lto.build_defines(lto_config(kernels=("prefill",), archs=("sm_80",)), "prefill") == ""
    src = lto.template_source("prefill", 128, DtypePair("float16", "float16"), 8, 1,
                              lto.build_defines(hopper, "prefill", 1))
    assert src.splitlines()[:3] == ["#define ATTNGEN_WITH_PREFILL_HOPPER 1", "#define ATTNGEN_SMEM_OPTIN_FLOOR 232448",
                                    lto.ONE_TILING_DEFINE]
    assert lto.ONE_TILING_DEFINE in lto.launch_source(hopper, 128)


# ---- fp8 K/V caches ----

def fp8_lto_config(**kw) -> BuildConfig:
    """Decode and prefill over an e4m3 cache for sm_90a (the Hopper prefill's part too), one layout."""
    base = dict(kernels=("decode", "prefill"), archs=("sm_90a",), kv_dtypes=("float8_e4m3fn",), layouts=("NHD",))
    return lto_config(**{**base, **kw})


class _KeyOnly:
    """A cache that records the key it is asked for and builds nothing."""

    def get_or_build(self, key, build):
        raise _Keyed(key)


class _Keyed(Exception):
    pass


def _key_of(make, *args) -> str:
    with pytest.raises(_Keyed) as e:
        make(*args, _KeyOnly())
    return e.value.args[0]


def test_object_keys_cover_the_compilers_flags_environment_and_host_compiler(monkeypatch):
    """The template, launch and merge objects' keys change with nvcc's flags, the environment variables nvcc
    reads and the host compiler (which preprocesses even a device-only compile), and not with where attngen is
    installed (a cache built elsewhere serves)."""
    from attngen.codegen import host_library, nvcc

    d, pair, cfg = 128, DtypePair("float16", "float16"), lto_config()
    abi = abi_traits_source(builtin("causal"), lower_hooks_cuda(builtin("causal"), d, "sm_80"), d)
    merge_gencodes = ["-gencode=arch=compute_80,code=sm_80"]

    def keys():
        return (lto.template_key("decode", "sm_80", d, pair, cfg, abi), _key_of(lto.launch_object, cfg, d, abi),
                _key_of(host_library.merge_object, merge_gencodes))

    for name in nvcc.COMPILER_ENV:
        monkeypatch.delenv(name, raising=False)
    base = keys()
    assert all("/" not in flag for flag in lto.flag_text(cfg))  # directories as placeholders
    with monkeypatch.context() as m:
        m.setenv("NVCC_APPEND_FLAGS", "-lineinfo")
        assert all(k != b for k, b in zip(keys(), base))
    with monkeypatch.context() as m:
        m.setattr(host_library, "host_cxx", lambda: ("g++", "g++ (GCC) 99.1"))
        m.setattr(lto, "host_cxx", lambda: ("g++", "g++ (GCC) 99.1"))
        assert all(k != b for k, b in zip(keys(), base))
    with monkeypatch.context() as m:
        m.setattr(lto, "TEMPLATE_MODE", ("-rdc=true", "-fatbin", "-lineinfo"))
        m.setattr(lto, "LAUNCH_FLAGS", ("-Xcompiler", "-fvisibility=default"))
        assert keys()[0] != base[0] and keys()[1] != base[1] and keys()[2] == base[2]
    assert keys() == base


def test_template_objects_are_keyed_by_the_kv_dtype():
    """A template object instantiates its launcher over the cache's element type: the source names it and the
    key differs between a bf16 cache and each fp8 one."""
    v, d, cfg = builtin("logits_softcap"), 128, fp8_lto_config(dtypes=("bfloat16",))
    abi = abi_traits_source(v, lower_hooks_cuda(v, d, "sm_90a"), d)
    pairs = [DtypePair("bfloat16", kv) for kv in ("bfloat16", "float8_e4m3fn", "float8_e5m2")]
    for record, part in (("decode", 0), ("decode", 1), ("prefill", 0), ("prefill", 1)):
        sources = [lto.template_source(record, d, pair, 8, part) for pair in pairs]
        assert "__nv_fp8" not in sources[0]
        assert "DecodeProblemOf<__nv_fp8_e4m3>" in sources[1] or "PrefillProblemOf<__nv_fp8_e4m3>" in sources[1]
        assert "__nv_fp8_e5m2" in sources[2]
        keys = {lto.template_key(record, "sm_90a", d, pair, cfg, abi, part) for pair in pairs}
        assert len(keys) == 3, record


def test_linked_fp8_exports_are_the_whole_builds():
    """The linked build's fp8 exports: the whole-program build's names (the tile-map classifier among them), each
    over the whole build's fp8 entry template, with the entry's own arguments."""
    cfg = fp8_lto_config(layouts=("NHD", "HND"))
    names = sorted(e.name for pair in cfg.dtype_pairs for e in lto.linked_exports(cfg, 128, pair))
    whole = exported_functions(dataclasses.replace(cfg, link="whole"))
    assert names == exported_functions(cfg) == whole
    assert len(names) == 6 and all("_f16_kve4m3_d128" in n for n in names)
    launch = lto.launch_source(cfg, 128)
    assert '#include "entry_decode_fp8.h"' in launch and '#include "entry_prefill_fp8.h"' in launch
    block = "attngen::BlockHooks<attngen_gen::Hooks_d128>"
    assert (f"attngen::DecodePagedFP8Entry<{block}, half, __nv_fp8_e4m3, 128, attngen::KVLayout::kHND, 8, "
            "attngen_linked::kName_batch_decode_paged_hnd_f16_kve4m3_d128>") in launch
    assert (f"attngen::PrefillRaggedFP8Entry<{block}, half, __nv_fp8_e4m3, 128, "
            "attngen_linked::kName_batch_prefill_ragged_f16_kve4m3_d128>") in launch
    exports = lto.exports_source(builtin("causal"), cfg, {128: linked_params_source(
        builtin("causal"), lower_hooks_cuda(builtin("causal"), 128, "sm_90a"), 128)})
    for own in ("DecodeFP8OwnArgs", "PrefillPagedFP8OwnArgs", "PrefillRaggedFP8OwnArgs"):
        assert f"attngen::{own}>::call" in exports, own
    # a cache in the query dtype keeps its entries and argument lists
    plain = lto.launch_source(fp8_lto_config(kv_dtypes=()), 128)
    assert "fp8" not in plain.lower() and "FP8OwnArgs" not in plain


@pytest.fixture(scope="module")
def fp8_linked(build_cache):
    """The linked build of :func:`fp8_lto_config` (decode and prefill, both prefill templates, all linked up front)."""
    return build(builtin("logits_softcap"), fp8_lto_config(defer_alternatives=False), cache=build_cache)


@requires_nvcc
@requires_nvjitlink
def test_linked_fp8_library_exports_and_embeds_the_fp8_kernels(fp8_linked):
    res = fp8_linked
    assert res.manifest["link"] == "lto" and res.manifest["functions"] == exported_functions(fp8_lto_config())
    assert not res.manifest["deferred"]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(res.library)], capture_output=True, text=True).stdout
    for fn in res.manifest["functions"]:
        assert f"__tvm_ffi_{fn}" in syms
    kernels = res.manifest["kernels"]
    # every attention kernel reads the e4m3 cache (the key's last argument); the merge reads float32 states (soft-cap
    # links no tile-map classifier: lto.part_serves)
    assert all(", __nv_fp8_e4m3" in k for k in kernels if not k.startswith("merge_")), kernels
    assert not any(k.startswith("tile_") for k in kernels), kernels
    # the tensor-core decode at the fp8 stage count of the decode_tc record (3 at D 128: deeper, half-size stages)
    for k in ("decode_kernel<__half, 128, 1, __nv_fp8_e4m3>", "decode_kernel<__half, 128, 8, __nv_fp8_e4m3>",
              "decode_tc_kernel<__half, 128, 3, __nv_fp8_e4m3>", "merge_decode_kernel<__half, 128>",
              "hopper_prefill_kernel<__half, 128, false, __nv_fp8_e4m3, false, false>"):
        assert k in kernels, k
    assert any(k.startswith("prefill_kernel<__half, 128,") for k in kernels), kernels
    assert res.manifest["cubins"] == [f"linked_sm_90a_{i}.cubin" for i in range(4)]
    for c in res.manifest["cubins"]:
        cubin = (res.directory / c).read_bytes()
        assert linked_cubin.cubin_kernels(cubin) and b"attngen_abi_" not in cubin


@requires_nvcc
@requires_nvjitlink
def test_linked_fp8_library_checks_arguments_like_a_whole_one(fp8_linked):
    """On the CPU: the fp8 exports take the whole build's arguments (k_scale, v_scale after lse) and reach the
    fp8 entries' checks through the launch object."""
    import torch
    import tvm_ffi

    mod = tvm_ffi.load_module(str(fp8_linked.library))
    name = "batch_decode_paged_nhd_f16_kve4m3_d128"
    q = torch.zeros(2, 8, 128, dtype=torch.float16)
    pages = torch.zeros(4, 2, 16, 2, 128).to(torch.float8_e4m3fn)
    i32 = torch.zeros(3, dtype=torch.int32)
    scale = torch.ones(2)
    own = [q, pages, i32, i32, i32, torch.zeros_like(q), torch.zeros(2, 8), scale, scale, 0.1, torch.zeros(1),
           torch.zeros(1), 1, 0, None, 0, 0, 1]
    with pytest.raises(TypeError, match=rf"{name}: pages: expected element type float8_e4m3fn, got float16"):
        mod[name](*own[:1], pages.half(), *own[2:], 30.0)
    with pytest.raises(TypeError, match=rf"{name}: v_scale: expected element type float32, got float16"):
        mod[name](*own[:8], scale.half(), *own[9:], 30.0)
    with pytest.raises(ValueError, match=rf"{name}: q: expected a CUDA tensor"):
        mod[name](*own, 30.0)
    with pytest.raises(TypeError, match=r"Mismatched number of arguments .*18: float\) -> void"):
        mod[name](*own)
    ragged = "batch_prefill_ragged_f16_kve4m3_d128"
    k = torch.zeros(5, 2, 128).to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match=rf"{ragged}: k: expected element type float8_e4m3fn, got float16"):
        mod[ragged](q, k.half(), k, i32, i32, torch.zeros_like(q), torch.zeros(2, 8), scale, scale, 0.1, 1, 0, 0,
                    None, None, 0, None, None, 30.0)


def _compare_builds():
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from bench_lto_ab import compare_builds

    return compare_builds


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", [("decode",), ("prefill",)])
def test_linked_and_whole_libraries_agree_on_the_gpu(kernels, build_cache):
    """The same variant built both ways runs through the same runtime with bit-identical outputs."""
    report = _compare_builds()(builtin("logits_softcap"), kernels=kernels, cache=build_cache, repeats=3)
    assert report["identical"], report


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_linked_and_whole_fp8_libraries_agree_on_the_gpu(kv_dtype, build_cache):
    """Over an fp8 cache (k_scale / v_scale): decode on both decode templates, paged and ragged prefill on the
    mma.sync template and, on compute capability 9.0, the Hopper one, bit-identical both ways."""
    report = _compare_builds()(builtin("logits_softcap"), kernels=("decode", "prefill"), kv_dtype=kv_dtype,
                               cache=build_cache, repeats=3)
    assert report["kv_dtype"] == kv_dtype and len(report["calls"]) >= 5, report
    assert report["identical"], report


# ---- parts linked on first use ----

@requires_nvcc
@requires_nvjitlink
def test_alternatives_link_on_first_use(build_cache):
    """On sm_90a the CUDA-core decode and the mma.sync prefill serve only plans that ask for them: the build
    links the tensor-core decode and the Hopper prefill, and names the two others in its manifest; linked later
    from the hook object and the cached template objects, they hold those kernels with the hooks inlined, and the
    library takes them through its registration function (the launchers find them there, on the GPU:
    test_linked_and_whole_libraries_agree_on_the_gpu forces both)."""
    import tvm_ffi

    cfg = lto_config(kernels=("decode", "prefill"), archs=("sm_90a",))
    assert cfg.defer_alternatives and lto.deferred_part(cfg, "sm_90a", "decode", 0)
    assert not lto.deferred_part(cfg, "sm_90a", "decode", 1) and not lto.deferred_part(cfg, "sm_80", "decode", 0)
    res = build(scaled_softcap(1.0), cfg, cache=build_cache)
    # the tensor-core decode, the Hopper prefill (soft-cap reaches no tile-map classifier: lto.part_serves)
    assert res.manifest["cubins"] == ["linked_sm_90a_1.cubin", "linked_sm_90a_3.cubin"]
    assert len(res.manifest["lto_reused"]["templates"]) == 2  # the deferred parts' templates are not compiled either
    assert [(e["arch"], e["part"]) for e in res.manifest["deferred"]] == [("sm_90a", 0), ("sm_90a", 2)]
    kernels = res.manifest["kernels"]
    assert not any(k.startswith(("decode_kernel<", "prefill_kernel<")) for k in kernels), kernels
    assert "decode_tc_kernel<__half, 128, 2, __half>" in kernels
    # one tiling: soft-cap's 176-key one, which calls of any length run
    assert "hopper_prefill_kernel<__half, 128, false, __half, true, false>" in kernels
    assert "hopper_prefill_kernel<__half, 128, false, __half, false, false>" not in kernels
    assert lto.link_deferred(res.directory, res.manifest, 80, build_cache) == []  # none for sm_8x devices
    parts = lto.link_deferred(res.directory, res.manifest, 90, build_cache)
    assert [sm for _, sm, _ in parts] == [90, 90]
    assert all(k.startswith("decode_kernel<__half, 128, ") for k in parts[0][2]) and len(parts[0][2]) == 4
    assert parts[1][2] and all(k.startswith("prefill_kernel<__half, 128") for k in parts[1][2])
    for cubin, _, table in parts:
        assert b"attngen_abi_" not in cubin and sorted(table.values()) == linked_cubin.cubin_kernels(cubin)
    # cache entries of their own (a later process reads them); the library's entry stays sealed as built
    assert entry_is_sealed(res.directory)
    again = lto.link_deferred(res.directory, res.manifest, 90, build_cache, records=("prefill",))
    assert [c for c, _, _ in again] == [parts[1][0]]  # one record's parts only
    register = tvm_ffi.load_module(str(res.library))["attngen_register_linked_cubin"]
    for i, (cubin, sm, table) in enumerate(parts):
        assert register(cubin, sm, [x for kv in sorted(table.items()) for x in kv]) == i + 1
    with pytest.raises(ValueError, match="key / mangled-name pairs"):
        register(parts[0][0], 90, ["decode_kernel<__half, 128, 1, __half>"])
    # a deferred part's template object: found by key, or compiled from the hook signature kept beside the
    # library when this attngen makes the same object; a library of other sources is refused
    entry = res.manifest["deferred"][0]
    assert lto.deferred_template(res.directory, res.manifest, entry, build_cache).parent.name == entry["template"]
    with pytest.raises(ConfigError, match="cannot compile the same object"):
        lto.deferred_template(res.directory, res.manifest, {**entry, "template": "0" * 64}, build_cache)
    # a build that links everything up front keys apart and defers nothing
    assert dataclasses.replace(cfg, defer_alternatives=False).key() != cfg.key()


@requires_nvcc
@requires_nvjitlink
def test_linked_row_hook_pass_kernel(build_cache):
    """A variant with key / query transforms links the row-hook pass (csrc/hook_pass.cuh) into the classifier's
    part, keyed by head dim alone (it reads the element type from a flag)."""
    res = build(builtin("rope"), lto_config(kernels=("prefill",)), cache=build_cache)
    assert [k for k in res.manifest["kernels"] if k.startswith("hook_pass")] == ["hook_pass_kernel<128>"]
    assert "tile_map_kernel<128>" in res.manifest["kernels"]  # (the part holds the classifier too)
