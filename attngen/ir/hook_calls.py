"""Which calls a hook may make: the TIR operations that both code generators lower, in the dtypes
they lower them for.

A hook is compiled twice, by LLVM for the CPU backend (the oracle every variant is checked against)
and by TVM's CUDA generator and nvcc for the GPU. A call that one of them cannot compile would stop a
build deep inside LLVM or nvcc, and a call to a C function the CPU library cannot resolve would end the
process that loads it; so the calls are checked when the variant is made:

* TIR math (``T.exp``, ``T.tanh``, ``T.pow``, ...), ``T.if_then_else``, ``T.likely``, ``T.reinterpret``,
  bit counting and the integer operations; on 16-bit floats only the functions both compilers have a
  16-bit form of (:data:`HALF_MATH`), the others want their argument cast to float32 first;
* ``T.fmod`` nowhere (LLVM has no lowering for it): ``T.call_pure_extern("float32", "fmodf", x, y)``
  computes the same on both targets;
* ``T.call_pure_extern`` to the C math functions of :data:`LIBM` only, with the C name of the call's
  dtype (``tanhf`` for float32, ``tanh`` for float64: a float32 call of ``tanh`` would pass a float where
  the CPU library reads a double);
* nothing target-specific (``T.cuda.*``, ``T.ptx.*``, thread, warp and memory intrinsics): a hook is a
  pure function of one element.
"""
from __future__ import annotations

import tvm

from . import tir_utils as tu
from .errors import VariantError

# TIR math on float32 and float64 that LLVM and CUDA lower alike (by the op's name after its namespace)
FLOAT_MATH = frozenset("""exp exp2 exp10 log log2 log10 log1p sqrt rsqrt tanh sigmoid sin cos tan asin acos atan
    sinh cosh asinh acosh atanh erf floor ceil round trunc nearbyint fabs pow atan2 hypot copysign nextafter
    ldexp isnan isinf isfinite fma""".split())
# the part of FLOAT_MATH that also takes float16 / bfloat16 arguments on both (cuda_fp16.h / cuda_bf16.h
# have no hatan, hcosh, herf, hpow, ...; LLVM lowers no 16-bit acos, asin, atan2, erf, log1p, ...)
HALF_MATH = frozenset("exp exp2 exp10 log log2 log10 sqrt rsqrt tanh sigmoid sin cos floor ceil round trunc fabs"
                      .split())
# other operations of one element: selection, hints, bit casts and counts, integer and loop control
OTHER_OPS = frozenset("""if_then_else likely assume reinterpret popcount clz q_multiply_shift bitwise_and
    bitwise_or bitwise_xor bitwise_not shift_left shift_right break_loop continue_loop""".split())
# C math functions a hook may name in T.call_pure_extern: the libm functions the CPU library resolves and
# CUDA has as device functions, each as <name>f for float32 and <name> for float64
LIBM = frozenset("""exp exp2 log log2 log10 log1p sqrt tanh sin cos tan sinh cosh asin acos atan erf floor ceil
    round trunc fabs pow atan2 fmod hypot copysign nextafter""".split())
_HALF = ("float16", "bfloat16")
_EXTERN_SUFFIX = {"float32": "f", "float64": ""}
_FMOD_FIX = "write T.call_pure_extern('float32', 'fmodf', x, y) (the C library's fmod on both targets)"
_OP_FIX = ("use TIR arithmetic and math (T.exp, T.tanh, T.pow, T.if_then_else, ...); a hook is a pure function "
           "of one element, so thread, warp, memory and target-specific intrinsics have no place in it")


def extern_base_name(dtype: str, fname: str) -> str:
    """The math function a C name stands for in a call of ``dtype``: a float32 name without its one trailing
    'f' (``erff`` -> ``erf``), any other as it is (``erf`` of float64)."""
    suffix = _EXTERN_SUFFIX.get(dtype)
    return fname[:-len(suffix)] if suffix and fname.endswith(suffix) else fname


def op_name(call) -> str | None:
    """The name of a call's operator after its namespace (``tirx.exp`` -> ``exp``, ``prim.likely`` ->
    ``likely``); None for a namespaced intrinsic (``tirx.cuda.thread_rank``) or a call of a function."""
    name = getattr(call.op, "name", None)
    if not isinstance(call.op, tvm.ir.Op) or name is None:
        return None
    space, _, rest = name.partition(".")
    return rest if space in ("tirx", "prim") and rest and "." not in rest else None


def check_calls(variant: str, hook: str, func) -> None:
    """Raise :class:`VariantError` at the first call of ``func`` (a hook of ``variant``) that the rules
    above refuse."""
    for call in tu.collect(func.body, tvm.ir.Call):
        problem = _call_problem(call)
        if problem is not None:
            raise VariantError(variant, hook, problem[0], problem[1], tu.source_line(func.body))


def _call_problem(call) -> tuple[str, str] | None:
    """(what is wrong, the fix) for a call a hook may not make; None for one it may."""
    name = op_name(call)
    if name == "call_pure_extern":
        return _extern_problem(call)
    if name == "fmod":
        return "calls T.fmod, which the CPU backend (LLVM) cannot compile", _FMOD_FIX
    if name in FLOAT_MATH:
        return _half_problem(name, call.args)
    if name in OTHER_OPS:
        return None
    shown = getattr(call.op, "name", None) or str(call.op)
    return (f"calls {shown}, which is not an operation both code generators (CPU: LLVM, CUDA: TVM and nvcc) "
            "compile in a hook", _OP_FIX)


def _half_problem(name: str, args) -> tuple[str, str] | None:
    """A math function on a 16-bit float that one of the compilers has no 16-bit form of."""
    half = next((str(a.ty) for a in args if str(a.ty) in _HALF), None)
    if half is None or name in HALF_MATH:
        return None
    return (f"calls T.{name} on a {half} value, which the CPU backend (LLVM) or nvcc cannot compile "
            f"(16-bit math functions: {sorted(HALF_MATH)})",
            f"compute it in float32: T.{name}(T.Cast('float32', x)), and cast the result back if needed")


def _extern_problem(call) -> tuple[str, str] | None:
    """``T.call_pure_extern(dtype, name, *args)``: a C math function of LIBM named for ``dtype``, whose
    arguments are all of ``dtype``."""
    dtype, fname = str(call.ty), getattr(call.args[0], "value", None)
    suffix = _EXTERN_SUFFIX.get(dtype)
    base = extern_base_name(dtype, fname) if isinstance(fname, str) else fname
    if suffix is None or base not in LIBM or fname != base + suffix:
        return (f"calls the C function {fname!r} ({dtype}) through T.call_pure_extern; a hook may call only the C "
                "math functions both targets have (a function the CPU library cannot resolve ends the process "
                "that loads it)",
                f"use TIR math (T.exp, T.tanh, ...), or a function of {sorted(LIBM)} by the C name of the call's "
                "dtype: 'tanhf' for float32, 'tanh' for float64")
    wrong = [str(a.ty) for a in call.args[1:] if str(a.ty) != dtype]
    if wrong:
        return (f"calls {fname} ({dtype}) through T.call_pure_extern with a {wrong[0]} argument; the C function "
                f"takes {dtype}", f"cast every argument to {dtype} (T.Cast('{dtype}', x))")
    return None
