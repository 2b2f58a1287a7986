"""fp8 K/V elements in TIR for the CPU (LLVM) backend: the bits of a stored element to its float32 value.

The kernels take fp8 caches as ``uint8`` buffers of the bits and decode them here with integer
arithmetic and one float16 reinterpretation. TVM 0.27's LLVM lowering of a ``float8_e4m3fn`` /
``float8_e5m2`` to ``float32`` cast is wrong for zero, the subnormals and the non-finite codes (it
decodes the bits 0x00 of e4m3 as 2**-7), so the kernels never cast an fp8 value directly.

* e5m2 is the upper byte of an IEEE float16 (same exponent width and bias), so ``bits << 8``
  reinterpreted as float16 is the value, subnormals, infinities and NaNs included.
* e4m3fn (bias 7, no infinities, NaN = S.1111.111) placed as ``sign << 15 | rest << 7`` is a float16
  with the same mantissa and the exponent field unchanged, that is its value times 2**(7 - 15); the
  float32 product with 2**8 restores it exactly (float16 subnormals are normal float32 numbers).
"""
from __future__ import annotations

import tvm.tirx as tir
from tvm.script import tirx as T

from attngen.schedules.dtypes import FP8_DTYPES

FP8_STORAGE = "uint8"  # the kernels' element type of an fp8 buffer (the bits)


def _u16(x: int):
    return tir.const(x, "uint16")


def fp8_to_float32(bits, dtype: str) -> tir.PrimExpr:
    """The float32 value of the ``uint8`` expression ``bits`` holding one ``dtype`` element."""
    if dtype not in FP8_DTYPES:
        raise ValueError(f"{dtype} is not an fp8 format ({list(FP8_DTYPES)})")
    wide = T.Cast("uint16", bits)
    if dtype == "float8_e5m2":
        return T.Cast("float32", T.reinterpret("float16", T.shift_left(wide, _u16(8))))
    sign = T.shift_left(T.bitwise_and(wide, _u16(0x80)), _u16(8))
    rest = T.shift_left(T.bitwise_and(wide, _u16(0x7F)), _u16(7))
    value = T.Cast("float32", T.reinterpret("float16", T.bitwise_or(sign, rest))) * T.float32(256.0)
    is_nan = T.bitwise_and(bits, tir.const(0x7F, "uint8")) == tir.const(0x7F, "uint8")
    return T.if_then_else(is_nan, T.float32("nan"), value)
