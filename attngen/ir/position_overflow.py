"""Integer arithmetic on positions that could leave int32: refused when the variant is made.

A hook's ``qo_pos`` and ``kv_pos`` are int32. The kernels compute a hook's int32 arithmetic in int32, the
reference interpreter in int64 (ir/tir_eval.py), and the mask analysis simplifies as if nothing overflowed
(``kv_pos * 1000000 <= qo_pos * 1000000`` reads as causal): a product or sum that wraps in the kernel would
be three different answers. Every request the runtime accepts has fewer than :data:`MAX_POSITION` keys
(runtime/checks.py refuses longer ones), so every position lies in ``[0, MAX_POSITION)``; an int32
sub-expression of positions and constants whose range under that bound leaves int32 is refused, with the
int64 cast that computes it exactly. Sub-expressions that read an extra parameter are left alone: their
range is the caller's values, not the variant's.
"""
from __future__ import annotations

import tvm
import tvm.sym
import tvm.tirx as tir

from . import tir_utils as tu
from .errors import VariantError

MAX_POSITION = 2**30  # positions lie in [0, MAX_POSITION): requests hold fewer keys than this
POSITIONS = ("qo_pos", "kv_pos")
_INT32 = (-2**31, 2**31 - 1)
_ARITH = (tir.Add, tir.Sub, tir.Mul, tir.LShift)


def position_overflow(func) -> tuple[object, tuple[int, int]] | None:
    """The first (innermost) int32 sub-expression of ``func``'s positions and constants whose range leaves
    int32 for positions below :data:`MAX_POSITION`, with that range; None if there is none."""
    pos = {tu.handle(p) for p in func.params if not tir.is_buffer_var(p) and p.name in POSITIONS}
    if not pos:
        return None
    ana = tvm.sym.Analyzer()
    for p in func.params:
        if tu.handle(p) in pos:
            ana.bind(p, tvm.ir.Range(0, MAX_POSITION))
    for node in tu.collect(tu.expand_binds(func.body), _ARITH):
        if str(node.ty) != "int32":
            continue
        used = {tu.handle(v) for v in tu.used_vars(node)}
        if not used or not used <= pos:
            continue
        b = ana.const_int_bound(node)
        if b.min_value < _INT32[0] or b.max_value > _INT32[1]:
            return node, (int(b.min_value), int(b.max_value))
    return None


def check_position_arithmetic(variant: str, hook: str, func) -> None:
    """Raise :class:`VariantError` when ``func`` (a hook) has int32 arithmetic on positions that can wrap."""
    found = position_overflow(func)
    if found is None:
        return
    node, (lo, hi) = found
    raise VariantError(
        variant, hook,
        f"'{node}' is int32 and reaches {hi if hi > _INT32[1] else lo} for positions below 2^30, past the int32 "
        "range: the kernels would wrap where the reference does not",
        "compute it in int64 (T.Cast('int64', kv_pos) * ...), or keep the arithmetic on qo_pos - kv_pos",
        tu.source_line(node))
