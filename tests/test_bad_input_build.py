"""Build-time inputs that no build could serve, each refused when the variant or the configuration is made,
with an error naming the hook or argument and the fix (no LLVM, nvcc or TVM failure, no silently wrong
library): hook calls the code generators cannot compile, parameter declarations, malformed BuildConfig
fields, and the command line's options. Nothing here compiles."""
import pytest
from tvm.script import tirx as T

from attngen import ConfigError, ScalarParam, TensorParam, Variant, VariantError
from attngen.cli import main
from attngen.codegen.cuda_library import exported_functions
from attngen.loader import pick_variant
from attngen.schedules import BuildConfig

CUDA = dict(target="cuda", head_dims=(128,), dtypes=("float16",), archs=("sm_80",))


# --- calls a hook may make ----------------------------------------------------------------------------------

@T.prim_func
def with_fmod(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
              kv_head: T.int32) -> T.float32:
    return T.fmod(s, T.float32(3))


@T.prim_func
def with_libm_fmod(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                   kv_head: T.int32) -> T.float32:
    return T.call_pure_extern("float32", "fmodf", s, T.float32(3))


def test_fmod_is_refused_with_the_call_both_targets_compile():
    """LLVM has no lowering of T.fmod: the CPU build stopped inside TVM's LLVM code generator."""
    with pytest.raises(VariantError) as e:
        Variant("fm", logits_transform=with_fmod)
    msg = str(e.value)
    assert "variant 'fm', hook 'logits_transform'" in msg and "calls T.fmod" in msg
    assert "T.call_pure_extern('float32', 'fmodf', x, y)" in msg and "test_bad_input_build.py:" in msg
    Variant("fm", logits_transform=with_libm_fmod)  # the fix is accepted


@T.prim_func
def half_erf(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
             kv_head: T.int32) -> T.float32:
    return T.Cast("float32", T.erf(T.Cast("float16", s)))


@T.prim_func
def half_exp(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
             kv_head: T.int32) -> T.float32:
    return T.Cast("float32", T.exp(T.Cast("float16", s)))


@T.prim_func
def bf16_atan(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
    d = T.int32()
    x = T.match_buffer(x_ptr, (d,), "float32")
    y = T.match_buffer(y_ptr, (d,), "float32")
    for i in range(d):
        y[i] = T.Cast("float32", T.atan(T.Cast("bfloat16", x[i])))


def test_math_on_16_bit_floats_without_a_16_bit_form_is_refused():
    """LLVM has no float16 erf (the CPU build failed in TVM), nvcc no hatan (cuda_bf16.h): cast to float32."""
    with pytest.raises(VariantError, match=r"hook 'logits_transform' .*calls T.erf on a float16 value.*"
                                           r"Fix: compute it in float32: T.erf\(T.Cast\('float32', x\)\)"):
        Variant("he", logits_transform=half_erf)
    with pytest.raises(VariantError, match=r"hook 'query_transform' .*calls T.atan on a bfloat16 value"):
        Variant("ha", query_transform=bf16_atan)
    Variant("hx", logits_transform=half_exp)  # exp has 16-bit forms on both targets


@T.prim_func
def thread_rank(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                kv_head: T.int32) -> T.float32:
    return s + T.Cast("float32", T.cuda.thread_rank())


@T.prim_func
def warp_shuffle(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                 kv_head: T.int32) -> T.float32:
    return T.cuda.__shfl_sync(T.uint32(0xFFFFFFFF), s, 0, 32)


@pytest.mark.parametrize("hook, op", [(thread_rank, "tirx.cuda.thread_rank"), (warp_shuffle, "tirx.cuda.__shfl_sync")])
def test_target_specific_intrinsics_are_refused(hook, op):
    """A warp shuffle in a per-score hook was accepted and built; thread_rank failed inside LLVM."""
    with pytest.raises(VariantError) as e:
        Variant("ti", logits_transform=hook)
    assert "hook 'logits_transform'" in str(e.value) and f"calls {op}, which is not an operation" in str(e.value)


@T.prim_func
def extern_unknown(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                   kv_head: T.int32) -> T.float32:
    return T.call_pure_extern("float32", "my_cap", s)


@T.prim_func
def extern_double_name(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                       kv_head: T.int32) -> T.float32:
    return T.call_pure_extern("float32", "tanh", s)


@T.prim_func
def extern_double_arg(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                      kv_head: T.int32) -> T.float32:
    return T.call_pure_extern("float32", "tanhf", T.Cast("float64", s))


@T.prim_func
def extern_float(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                 kv_head: T.int32) -> T.float32:
    return T.call_pure_extern("float32", "tanhf", s)


@T.prim_func
def extern_double(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                  kv_head: T.int32) -> T.float32:
    return T.Cast("float32", T.call_pure_extern("float64", "tanh", T.Cast("float64", s)))


def test_pure_extern_calls_name_a_c_math_function_of_their_dtype():
    """An unknown function left the CPU library an undefined symbol that killed the loading process; a float32
    call of 'tanh' (a double function) gave wrong values on the CPU; a float64 argument to 'tanhf' likewise."""
    with pytest.raises(VariantError, match=r"hook 'logits_transform' .*calls the C function 'my_cap' \(float32\) "
                                           r"through T.call_pure_extern"):
        Variant("xu", logits_transform=extern_unknown)
    with pytest.raises(VariantError, match=r"calls the C function 'tanh' \(float32\).*'tanhf' for float32"):
        Variant("xd", logits_transform=extern_double_name)
    with pytest.raises(VariantError, match=r"calls tanhf \(float32\) through T.call_pure_extern with a float64 "
                                           r"argument.*Fix: cast every argument to float32"):
        Variant("xa", logits_transform=extern_double_arg)
    Variant("xf", logits_transform=extern_float)
    Variant("x64", logits_transform=extern_double)


# --- parameter declarations ---------------------------------------------------------------------------------

@T.prim_func
def scaled(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
           gain: T.bfloat16) -> T.float32:
    return s * T.Cast("float32", gain)


def test_bfloat16_scalar_parameter_is_refused():
    """TVM-FFI passes no bfloat16 scalars: the CPU build failed in TVM's argument binder."""
    with pytest.raises(VariantError) as e:
        Variant("bs", logits_transform=scaled, params=[ScalarParam("gain", "bfloat16", 1.0)])
    msg = str(e.value)
    assert "scalar parameter 'gain' is bfloat16" in msg
    assert "declare it ScalarParam('gain', 'float32') and round it in the hook with T.Cast('bfloat16', gain)" in msg


@pytest.mark.parametrize("name", ["p", "entry", "max", "min", "NAN"])
def test_names_the_generated_code_uses_are_refused(name):
    """``Params& p`` / ``const char* entry`` are set_params' own arguments, max() / min() the lowered hooks'
    calls, NAN a macro: a parameter of one of these names broke nvcc."""
    with pytest.raises(VariantError, match=rf"parameter name '{name}' is reserved"):
        Variant("rn", params=[ScalarParam(name)])


def test_a_parameter_named_like_a_tensors_size_is_refused():
    """The generated code passes a 2-D tensor's row length as <tensor>_dim1; a parameter of that name was
    declared twice in the traits struct (nvcc)."""
    params = [TensorParam("bias", "float32", ("batch_size", "num_qo_heads")), ScalarParam("bias_dim1", "int32", 0)]
    with pytest.raises(VariantError, match=r"parameter name 'bias_dim1' is the name the generated code gives a size "
                                           r"of tensor parameter 'bias'. Fix: rename 'bias_dim1'"):
        Variant("sz", params=params)


@T.prim_func
def wrapping_causal(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return kv_pos * 1000000 <= qo_pos * 1000000


@T.prim_func
def wide_causal(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return T.Cast("int64", kv_pos) * T.int64(1000000) <= T.Cast("int64", qo_pos) * T.int64(1000000)


@T.prim_func
def shifted_window(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return kv_pos + 128 > qo_pos and kv_pos * 2 <= qo_pos * 2 + 1


@T.prim_func
def position_bias(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                  kv_head: T.int32) -> T.float32:
    d: T.let = (qo_pos - kv_pos) * 4096
    return s - T.Cast("float32", d)


def test_int32_arithmetic_on_positions_that_can_wrap_is_refused():
    """``kv_pos * 1000000 <= qo_pos * 1000000`` was classified causal (the analysis assumes no overflow) while the
    kernel's int32 product wraps past position 2147 and the reference's int64 one does not: three readings of one
    mask. Positions lie within +-2^29 (longer requests are refused at run time), so the range of every int32
    sub-expression of positions and constants is known when the variant is made."""
    with pytest.raises(VariantError, match=r"hook 'logits_mask' .*'kv_pos \* 1000000' is int32 and reaches "
                                           r"536870911000000 .*Fix: compute it in int64"):
        Variant("wrap", logits_mask=wrapping_causal)
    with pytest.raises(VariantError, match=r"hook 'logits_transform' .*is int32 and reaches -?\d+ for positions "
                                           r"within \+-2\^29"):
        Variant("bias", logits_transform=position_bias)


@T.prim_func
def by_distance(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                kv_head: T.int32) -> T.float32:
    return s + T.Cast("float32", 100 // (qo_pos - kv_pos))


@T.prim_func
def by_distance_guarded(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                        kv_head: T.int32) -> T.float32:
    return s + T.Cast("float32", T.if_then_else(qo_pos != kv_pos, 100 // (qo_pos - kv_pos), 0))


@T.prim_func
def by_next_position(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                     kv_head: T.int32) -> T.float32:
    return s + T.Cast("float32", qo_pos % (kv_pos + 1))


def test_integer_division_by_a_position_term_that_can_be_0_is_refused():
    """``100 // (qo_pos - kv_pos)`` divides by 0 on the diagonal: the CPU library's process stopped (SIGFPE). In a
    branch of T.if_then_else (one branch evaluated) or by a term that cannot be 0 it is accepted."""
    with pytest.raises(VariantError, match=r"hook 'logits_transform' .*'100 // \(qo_pos - kv_pos\)' divides by "
                                           r"'qo_pos - kv_pos', which is 0 for some positions.*Fix: divide only "
                                           r"where it is not 0"):
        Variant("dist", logits_transform=by_distance)
    Variant("dist", logits_transform=by_distance_guarded)
    Variant("dist", logits_transform=by_next_position)


@T.prim_func
def narrowed(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return T.Cast("int32", T.Cast("int64", kv_pos) * T.int64(1000000)) <= qo_pos


def test_a_wide_position_term_cast_to_int32_is_refused():
    """Computed in int64 but cast back to int32, the product is truncated in the kernels and not in the
    reference."""
    with pytest.raises(VariantError, match=r"'T.Cast\(.int64., kv_pos\) \* T.int64\(1000000\)' is cast to int32 "
                                           r"and reaches 536870911000000 .*Fix: keep it in int64"):
        Variant("narrow", logits_mask=narrowed)


def test_position_arithmetic_inside_int32_or_in_int64_is_kept():
    """Sums with constants and doubling stay inside int32 within +-2^29 and keep their analysis (here a causal window
    of 128 keys, the doubling read exactly as kv_pos <= qo_pos); the product computed in int64 is accepted as
    written and evaluated per score."""
    mask = Variant("win", logits_mask=shifted_window).analysis.mask
    assert (mask.kind.value, int(mask.lower), int(mask.upper)) == ("causal_window", 0, 127)
    assert Variant("wide", logits_mask=wide_causal).analysis.mask.kind.value == "arbitrary"


@T.prim_func
def table8(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
           t: T.Buffer((8,), "float32")) -> T.float32:
    return s + t[T.min(qo_head, 7)]


@T.prim_func
def table4(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
           t: T.Buffer((4,), "float32")) -> T.bool:
    return t[T.min(qo_head, 3)] > T.float32(0)


def test_hook_buffer_sizes_must_fit_the_declaration_and_each_other():
    """Sizes no tensor could have were accepted, and every call then failed at run time."""
    with pytest.raises(VariantError, match=r"hook 'logits_transform' .*declares tensor parameter 't' dim 0 as 8, "
                                           r"but its TensorParam declares 4"):
        Variant("fx", logits_transform=table8, params=[TensorParam("t", "float32", (4,))])
    with pytest.raises(VariantError, match=r"declares tensor parameter 't' dim 0 as 8, but its TensorParam declares "
                                           r"it at least 16 \('n>=16'\)"):
        Variant("fx", logits_transform=table8, params=[TensorParam("t", "float32", ("n>=16",))])
    with pytest.raises(VariantError, match=r"hook 'logits_mask' .*declares tensor parameter 't' dim 0 as 4, but "
                                           r"hook 'logits_transform' declares it as 8"):
        Variant("fx", logits_transform=table8, logits_mask=table4, params=[TensorParam("t", "float32", ("n",))])
    Variant("fx", logits_transform=table8, params=[TensorParam("t", "float32", (8,))])
    Variant("fx", logits_transform=table8, params=[TensorParam("t", "float32", ("n>=8",))])


@pytest.mark.parametrize("shape, meant", [(("num_qo_head",), "num_qo_heads"), (("head_dims",), "head_dim"),
                                          (("n", "total_qo"), "total_q"), (("n>=num_kv_head",), "num_kv_heads")])
def test_a_misspelled_call_size_is_refused_with_the_name_meant(shape, meant):
    """A near miss of a call size declared a free symbolic dim, which no call checks against its size."""
    with pytest.raises(ValueError, match=rf"TensorParam 't': dim .* is not a call size; did you mean '{meant}'\?"):
        TensorParam("t", "float32", shape)


def test_names_far_from_every_call_size_stay_free_symbolic_dims():
    assert TensorParam("t", "float32", ("num_heads", "rows")).dims[0].symbol == "num_heads"


def test_params_must_be_a_list():
    """A single parameter was iterated as if it were the list (a TypeError from inside the constructor)."""
    with pytest.raises(VariantError, match=r"variant 'pl': params=ScalarParam .* is not a list of parameters. "
                                           r"Fix: pass a list"):
        Variant("pl", params=ScalarParam("gain"))


def test_an_overlong_variant_name_is_refused():
    """The name is part of the library's file name: 250 characters failed in the linker."""
    with pytest.raises(VariantError, match=r"variant name of 250 characters is too long.*at most 128 characters"):
        Variant("a" * 250)


# --- BuildConfig --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, problem", [
    (dict(head_dims=(64.5,)), r"head_dims: 64.5 is not a whole number"),  # was truncated to 64
    (dict(head_dims=("64",)), r"head_dims: '64' is not a whole number"),
    (dict(CUDA, kernels=("tvm",), tvm_window=1.5), r"tvm_window: 1.5 is not a whole number"),
    (dict(head_dims=64), r"head_dims=64 is not a tuple; give a tuple of values, e.g. head_dims=\(128,\)"),
    (dict(dtypes="float32"), r"dtypes='float32' is not a tuple"),  # was read as dtypes 'f', 'l', ...
    (dict(CUDA, archs="sm_80"), r"archs='sm_80' is not a tuple"),
    (dict(layouts="NHD"), r"layouts='NHD' is not a tuple"),
    (dict(CUDA, kernels="decode"), r"kernels='decode' is not a tuple"),
    (dict(CUDA, fast_math="no"), r"fast_math='no' is not a boolean"),  # was fast math on
])
def test_malformed_fields_are_refused_by_name(kwargs, problem):
    with pytest.raises(ConfigError, match=problem):
        BuildConfig(**kwargs)


def test_repeated_entries_are_built_once():
    """A layout given twice exported each paged function twice from one translation unit (nvcc: redefinition);
    sm_90 and sm_90a are one arch."""
    cfg = BuildConfig(**dict(CUDA, archs=("sm_90", "sm_90a"), head_dims=(128, 128), layouts=("NHD", "nhd"),
                             kernels=("decode", "prefill", "decode")))
    assert (cfg.archs, cfg.head_dims, cfg.layouts) == (("sm_90a",), (128,), ("NHD",))
    assert cfg.kernels == ("decode", "prefill")
    functions = exported_functions(cfg)
    assert len(functions) == len(set(functions))
    pairs = BuildConfig("cpu", (64,), ("float16", "float16", "float16"),
                        kv_dtypes=("float16", "float8_e4m3fn", "float16")).dtype_pairs
    assert [(p.q, p.kv) for p in pairs] == [("float16", "float16"), ("float16", "float8_e4m3fn")]


def test_no_layout_is_refused_where_decode_would_export_nothing():
    """layouts=() built a library without its decode functions, silently."""
    with pytest.raises(ConfigError, match=r"layouts=\(\): the CPU backend's decode functions read a paged KV cache"):
        BuildConfig("cpu", (64,), ("float32",), layouts=())
    with pytest.raises(ConfigError, match=r"kernel 'decode' exports one function per paged layout"):
        BuildConfig(**dict(CUDA, layouts=(), kernels=("decode", "prefill")))
    assert exported_functions(BuildConfig(**dict(CUDA, layouts=(), kernels=("prefill",)))) == [
        "batch_prefill_ragged_f16_d128", "prefill_tile_map_f16_d128"]


@pytest.mark.parametrize("constants, problem", [
    ((("soft_cap",),), r"tvm_constants: \('soft_cap',\) is not a \(name, value\) pair"),  # was a ValueError in dict()
    ((("soft_cap", 1.0), ("soft_cap", 2.0)), r"tvm_constants: \['soft_cap'\] given more than once"),
])
def test_malformed_tvm_constants_are_refused(constants, problem):
    with pytest.raises(ConfigError, match=problem):
        BuildConfig(**dict(CUDA, kernels=("tvm",), tvm_constants=constants))


# --- the command line ---------------------------------------------------------------------------------------

def _error(capsys, argv) -> str:
    """stderr of a command that must fail with status 2 and no traceback."""
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own refusals
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    return err


def test_list_valued_options_name_the_option(capsys):
    err = _error(capsys, ["build", "causal", "--head-dim", "64.5"])
    assert "argument --head-dim: '64.5': expected comma-separated whole numbers, e.g. 64,128" in err
    assert "<lambda>" not in err
    err = _error(capsys, ["build", "causal", "--target", "cuda", "--arch", "sm_80", "--kernels", ""])
    assert "argument --kernels: '': expected template names among decode, prefill, tvm, or 'none'" in err


def test_cuda_options_of_a_cpu_build_are_refused(capsys):
    """--arch without --target cuda built a CPU library silently."""
    err = _error(capsys, ["build", "causal", "--arch", "sm_80"])
    assert "--arch sm_80 is for cuda builds; add --target cuda" in err
    assert "--kernels tvm selects cuda templates; add --target cuda" in _error(
        capsys, ["build", "causal", "--kernels", "tvm"])


@pytest.mark.parametrize("flag", ["--cache-dir", "--out", "--dump"])
def test_directory_options_naming_a_file_are_refused(tmp_path, capsys, flag):
    """A file given for --cache-dir or --out ended the command with a NotADirectoryError / FileExistsError
    traceback."""
    afile = tmp_path / "a_file"
    afile.write_text("")
    err = _error(capsys, ["build", "causal", "--head-dim", "32", flag, str(afile)])
    assert f"{flag} {afile}: exists and is not a directory" in err


def test_inspect_checks_its_arch_and_head_dim(capsys):
    """inspect printed CUDA for sm_100 (no such target) and for head_dim 7, and blamed the hook for head_dim 0."""
    assert "unknown arch 'sm_100'" in _error(capsys, ["inspect", "causal", "--arch", "sm_100"])
    assert "--head-dim 0: attngen builds head dims [32, 64, 80, 96, 128, 256]" in _error(
        capsys, ["inspect", "rope", "--head-dim", "0"])
    assert main(["inspect", "causal", "--arch", "sm_90", "--head-dim", "64"]) == 0  # sm_90 is sm_90a
    assert "(head_dim 64, sm_90a)" in capsys.readouterr().out


def test_a_constant_given_twice_is_refused(capsys):
    """The last value won silently."""
    err = _error(capsys, ["build", "logits_softcap", "--constant", "soft_cap=30", "--constant", "soft_cap=40"])
    assert "--constant: ['soft_cap'] given more than once" in err


MASK = """\
from tvm.script import tirx as T
from attngen import Variant


@T.prim_func
def causal(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return kv_pos <= qo_pos


"""


def test_a_file_binding_one_variant_to_two_names_defines_one(tmp_path):
    """It was refused as 'several variants ['mine', 'mine']'."""
    src = tmp_path / "alias.py"
    src.write_text(MASK + "v = Variant('mine', logits_mask=causal)\nvariant = v\n")
    assert pick_variant(str(src)).name == "mine"


def test_two_variants_of_one_name_are_refused(tmp_path, capsys):
    """--variant NAME picked the first of them silently."""
    src = tmp_path / "clash.py"
    src.write_text(MASK + "a = Variant('mine', logits_mask=causal)\nb = Variant('mine')\n")
    with pytest.raises(ValueError, match=r"defines 2 different variants named 'mine'; give each variant a name"):
        pick_variant(str(src), "mine")
    assert "defines 2 different variants named 'mine'" in _error(capsys, ["inspect", str(src), "--variant", "mine"])


@pytest.mark.parametrize("kwargs, name", [({"head_dims": 128}, "head_dims"), ({"dtypes": "float32"}, "dtypes"),
                                          ({"layouts": "NHD"}, "layouts")])
def test_the_runtime_builders_refuse_a_field_that_is_no_tuple(kwargs, name):
    """CPUAttention.build / CUDAAttention.build hand their fields to BuildConfig as given, so its message (naming
    the field and its form) is what the caller sees, not a TypeError from tuple(128) or a dtype 'f'."""
    from attngen.runtime import CPUAttention
    from attngen.runtime.cuda import CUDAAttention
    from attngen.variants import builtin

    with pytest.raises(ConfigError, match=rf"{name}=.* is not a tuple"):
        CPUAttention.build(builtin("vanilla"), **kwargs)
    with pytest.raises(ConfigError, match=rf"{name}=.* is not a tuple"):
        CUDAAttention.build(builtin("vanilla"), archs=("sm_80",), **kwargs)


@T.prim_func
def extern_erf(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
               kv_head: T.int32) -> T.float32:
    return T.call_pure_extern("float32", "erff", s * T.float32(0.1)) + T.Cast(
        "float32", T.call_pure_extern("float64", "erf", T.Cast("float64", s) * T.float64(0.05)))


def test_erf_externs_evaluate_by_their_c_names():
    """The float64 interpreter reads a float32 extern's name without its one trailing 'f' (erff -> erf) and a
    float64 one as it is (it stripped every trailing 'f', so 'erf' became 'er'); the CPU backend, which calls the C
    functions, agrees with it."""
    import math

    import numpy as np

    from attngen.ir.tir_eval import eval_scalar_hook
    from attngen.runtime import CPUAttention
    from attngen.runtime.reference import reference_attention
    from attngen.testing import random_problem

    s = np.linspace(-30.0, 30.0, 61)
    zeros = np.zeros_like(s, dtype=np.int64)
    got = eval_scalar_hook(extern_erf, [s, zeros, zeros, zeros, zeros, zeros], {})
    want = [math.erf(x * 0.1) + math.erf(x * 0.05) for x in s]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    v = Variant("erf_logits", logits_transform=extern_erf)
    att = CPUAttention.build(v, head_dims=(32,), layouts=("NHD",))
    prob = random_problem(np.random.default_rng(3), [3, 1], [5, 7], 4, 2, 32)
    out, _ = att.prefill(prob.q, prob.ragged, prob.qo_indptr)
    ref, _ = reference_attention(v, prob.q, prob.keys, prob.values, prob.qo_indptr, 1 / math.sqrt(32))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


@T.prim_func
def window_from_query(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                      window_left: T.int32) -> T.bool:
    return kv_pos <= qo_pos and kv_pos >= qo_pos - window_left


def test_folding_a_value_that_makes_hook_arithmetic_wrap_is_refused():
    """with_constants folds a parameter into the hooks; a value the per-call check would refuse is refused there."""
    v = Variant("from_query", logits_mask=window_from_query, params=[ScalarParam("window_left", "int32")])
    with pytest.raises(VariantError, match=r"with_constants\(window_left=...\): with window_left = -2147483648, hook "
                                           r"'logits_mask' computes 'qo_pos - window_left' in int32.*Fix: fold a "
                                           r"value that keeps the term inside int32"):
        v.with_constants(window_left=-2**31)
    assert int(v.with_constants(window_left=2**30).analysis.mask.upper) == 2**30


@T.prim_func
def window_plus_one(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                    window: T.int32) -> T.bool:
    return qo_pos - kv_pos < window + 1


def test_a_default_every_call_would_refuse_is_refused_when_declared():
    """A default that makes a hook's int32 term wrap would have every call that leaves the parameter out refused."""
    with pytest.raises(VariantError, match=r"the default of parameter 'window': with window = 2147483647, hook "
                                           r"'logits_mask' computes 'window \+ 1' in int32.*Fix: declare a value "
                                           r"that keeps the term inside int32"):
        Variant("dw", logits_mask=window_plus_one, params=[ScalarParam("window", "int32", 2**31 - 1)])
    Variant("dw", logits_mask=window_plus_one, params=[ScalarParam("window", "int32", 2**31 - 2)])
