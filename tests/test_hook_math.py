"""The hooks' math modes on CUDA (codegen/hook_math.py): what each call becomes, without a GPU."""
import subprocess

import pytest
from tvm.script import tirx as T

from attngen.codegen.hook_math import APPROX_CALLS, APPROX_DIVIDE, APPROX_MAX_ERROR, pair_sin_cos
from attngen.codegen.hooks_cuda import lower_hooks_cuda
from attngen.codegen.pipeline import cache_key
from attngen.ir import ConfigError, ScalarParam, Variant
from attngen.schedules import BuildConfig
from attngen.variants import builtin

from .conftest import requires_nvcc


@T.prim_func
def every_function(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                   kv_head: T.int32, c: T.float32) -> T.float32:
    return (c * T.tanh(s / c) + T.exp(s) + T.exp2(s) + T.log(c) + T.log2(c) + T.sin(s) + T.cos(s)
            + T.pow(c, s) + T.sqrt(c))


def math_variant():
    return Variant("every_function", logits_transform=every_function, params=[ScalarParam("c", "float32", 2.0)])


def body(code: str) -> str:
    return code[code.index("ret_ptr[0] ="):]


def test_approx_mode_replaces_every_library_call_and_division():
    approx = body(lower_hooks_cuda(math_variant(), 64, "sm_80", "approx").code)
    precise = body(lower_hooks_cuda(math_variant(), 64, "sm_80", "precise").code)
    for accurate, fast in APPROX_CALLS.items():
        assert f"{accurate}(" in precise and f"{fast}(" in approx
        assert f" {accurate}(" not in approx and f"({accurate}(" not in approx
    assert APPROX_DIVIDE + "(s, c)" in approx and "(s / c)" in precise
    for kept in ("sqrtf(c)", "exp2f(s)", "sinf(s)", "cosf(s)", "powf(c, s)"):  # no approximation chosen: unchanged
        assert kept in approx


@pytest.mark.parametrize("mode", ["approx", "precise"])
def test_ropes_sine_and_cosine_come_from_one_sincosf(mode):
    """RoPE's hooks (the whole-row transforms and their per-element forms, queries and keys) take the sine and
    cosine of one angle: each of the four computes the pair with one sincosf, and no sinf / cosf is left."""
    import re

    code = lower_hooks_cuda(builtin("rope"), 128, "sm_90a", mode).code
    assert code.count("sincosf(angle, &angle_sin, &angle_cos);") == 4
    assert not re.search(r"(?<![\w.])(sinf|cosf)\(", code)


def test_sin_cos_pairing_leaves_what_it_cannot_pair():
    pairable = "  float a = x * 2.0f;\n  y = sinf(a) + cosf(a);\n"
    assert pair_sin_cos(pairable) == ("  float a = x * 2.0f;\n  float a_sin, a_cos;\n  sincosf(a, &a_sin, &a_cos);\n"
                                      "  y = a_sin + a_cos;\n")
    for kept in ("  float a = x;\n  y = sinf(a) + sinf(a);\n",  # no cosine
                 "  float a = x;\n  a = a * 2.0f;\n  y = sinf(a) + cosf(a);\n",  # assigned again
                 "  float a = x;\n  float a_sin = 1.0f;\n  y = sinf(a) + cosf(a) + a_sin;\n",  # name taken
                 "  float a = x;\n  y = __sinf(a) + __cosf(a) + asinf(a) + acosf(a);\n",  # other functions
                 "  {\n    float a = x;\n    y = sinf(a);\n  }\n  z = cosf(a);\n"):  # the cosine out of a's scope
        assert pair_sin_cos(kept) == kept
    # each function's local on its own: two scopes of one name
    two = ("void f() {\n  float a = x;\n  y = sinf(a) * cosf(a);\n}\n"
           "void g() {\n  float a = z;\n  w = cosf(a) - sinf(a);\n}\n")
    paired = pair_sin_cos(two)
    assert paired.count("sincosf(a, &a_sin, &a_cos);") == 2 and "y = a_sin * a_cos;" in paired
    assert "w = a_cos - a_sin;" in paired


def test_every_approximation_has_its_error_documented():
    assert set(APPROX_MAX_ERROR) == set(APPROX_CALLS.values()) | {APPROX_DIVIDE}


def test_softcap_header_per_mode():
    approx = lower_hooks_cuda(builtin("logits_softcap"), 128, "sm_90a").code  # approx is the default
    precise = lower_hooks_cuda(builtin("logits_softcap"), 128, "sm_90a", "precise").code
    assert "__tanhf(__fdividef(s, soft_cap))" in approx
    assert "__tanhf" not in precise and "tanhf((s / soft_cap))" in precise


def test_mode_is_part_of_the_build_config_and_key():
    with pytest.raises(ConfigError, match="hook_math 'fast'"):
        BuildConfig("cuda", (128,), ("float16",), ("sm_80",), hook_math="fast")
    a = BuildConfig("cuda", (128,), ("float16",), ("sm_80",))
    b = BuildConfig("cuda", (128,), ("float16",), ("sm_80",), hook_math="precise")
    assert a.hook_math == "approx"
    assert cache_key(builtin("logits_softcap"), a) != cache_key(builtin("logits_softcap"), b)


@requires_nvcc
@pytest.mark.parametrize("arch", ["sm_75", "sm_90a"])
def test_approx_header_compiles_twice_in_one_unit(arch, tmp_path):
    """The approximations are CUDA's own intrinsics: a unit including the hooks of two head dims compiles for the
    oldest and the newest arch."""
    from attngen.schedules.arch import arch_spec

    v = math_variant()
    for d in (64, 128):
        (tmp_path / f"h{d}.cuh").write_text(lower_hooks_cuda(v, d, arch).code)
    (tmp_path / "t.cu").write_text('#include "h64.cuh"\n#include "h128.cuh"\n'
                                   "__global__ void k(float* x) { attngen_every_function_d64_logits_transform("
                                   "x[0], 0, 0, 0, 0, 0, x[1], x + 2); }\n")
    p = subprocess.run(["nvcc", "-c", *arch_spec(arch).gencode.split(), str(tmp_path / "t.cu"), "-o",
                        str(tmp_path / "t.o")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@T.prim_func
def clamp_to_infinities(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                        kv_head: T.int32) -> T.float32:
    return T.min(T.max(s, T.infinity("float32") * T.float32(-1)), T.infinity("float32"))


@T.prim_func
def nan_to_infinity(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                    kv_head: T.int32) -> T.float32:
    return T.Cast("float32", T.max(T.Cast("float64", s), T.infinity("float64") * T.float64(-1)))


@requires_nvcc
@pytest.mark.parametrize("arch", ["sm_75", "sm_90a"])
def test_hooks_with_infinity_constants_compile(arch, tmp_path):
    """TVM writes an infinity as CUDART_INF_F (CUDART_INF in float64), math_constants.h's names: the hooks' header
    defines them, so a hook holding one compiles without that header (as under NVRTC)."""
    from attngen.schedules.arch import arch_spec

    calls = []
    for i, f in enumerate((clamp_to_infinities, nan_to_infinity)):
        code = lower_hooks_cuda(Variant(f"inf_constant{i}", logits_transform=f), 64, arch).code
        assert "CUDART_INF" in code
        (tmp_path / f"h{i}.cuh").write_text(code)
        calls.append(f"attngen_inf_constant{i}_d64_logits_transform(x[0], 0, 0, 0, 0, 0, x + {i + 1});")
    (tmp_path / "t.cu").write_text('#include "h0.cuh"\n#include "h1.cuh"\n__global__ void k(float* x) { '
                                   + " ".join(calls) + " }\n")
    p = subprocess.run(["nvcc", "-c", *arch_spec(arch).gencode.split(), str(tmp_path / "t.cu"), "-o",
                        str(tmp_path / "t.o")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
