"""Integer arithmetic on positions that could leave int32: refused when the variant is made.

A hook's ``qo_pos`` and ``kv_pos`` are int32. The kernels compute a hook's int32 arithmetic in int32, the
reference interpreter in int64 (ir/tir_eval.py), and the mask analysis simplifies as if nothing overflowed
(``kv_pos * 1000000 <= qo_pos * 1000000`` reads as causal): a product or sum that wraps in the kernel would
be three different answers. Every request the runtime accepts has fewer than :data:`MAX_POSITION` keys
(runtime/checks.py refuses longer ones), so every position lies in ``[0, MAX_POSITION)``; an int32
sub-expression of positions and constants whose range under that bound leaves int32 is refused, with the
int64 cast that computes it exactly. Sub-expressions that also read integer scalar parameters are checked
per call, with the values given (:func:`parameter_overflow`, from runtime/params.py): a window of 2^31 - 1
passed to ``qo_pos - kv_pos < window + 1`` would wrap to an empty window in the kernels alone.
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


def _int32_terms(func, names: set[str]):
    """(term, its vars by name) for every int32 sum, difference, product or shift of ``func`` that reads only
    the scalar arguments ``names`` and constants, innermost first (lets expanded)."""
    by_handle = {tu.handle(p): p for p in func.params if not tir.is_buffer_var(p) and p.name in names}
    for node in tu.collect(tu.expand_binds(func.body), _ARITH):
        if str(node.ty) != "int32":
            continue
        used = {tu.handle(v) for v in tu.used_vars(node)}
        if used and used <= set(by_handle):
            yield node, {by_handle[h].name: by_handle[h] for h in used}


def _wraps(node, vars_: dict, values: dict) -> tuple[int, int] | None:
    """The range of ``node`` with positions below MAX_POSITION and the other vars at ``values``, where it
    leaves int32; None where it stays inside."""
    ana = tvm.sym.Analyzer()
    fixed = {}
    for name, var in vars_.items():
        if name in POSITIONS:
            ana.bind(var, tvm.ir.Range(0, MAX_POSITION))
        else:
            fixed[tu.handle(var)] = tir.IntImm("int64", int(values[name]))
    if fixed:  # (values in int64: the bound is of the term's mathematical value)
        node = tu.substitute(node, fixed)
    b = ana.const_int_bound(node)
    return (int(b.min_value), int(b.max_value)) if b.min_value < _INT32[0] or b.max_value > _INT32[1] else None


def position_overflow(func) -> tuple[object, tuple[int, int]] | None:
    """The first (innermost) int32 sub-expression of ``func``'s positions and constants whose range leaves
    int32 for positions below :data:`MAX_POSITION`, with that range; None if there is none."""
    for node, vars_ in _int32_terms(func, set(POSITIONS)):
        wraps = _wraps(node, vars_, {})
        if wraps:
            return node, wraps
    return None


def parameter_overflow(variant, scalars: dict) -> tuple[str, str] | None:
    """(parameter, why) where the integer scalar parameter values ``scalars`` (name: value) make an int32 term
    of ``variant``'s hooks (positions, those parameters and constants) leave int32 for positions below
    MAX_POSITION; None if they do not."""
    ints = {p.name for p in variant.scalar_params if "int" in str(p.dtype)} & set(scalars)
    if not ints:
        return None
    for hook, func in variant.hooks.items():
        for node, vars_ in _int32_terms(func, ints | set(POSITIONS)):
            given = sorted(set(vars_) & ints)
            if not given:
                continue
            wraps = _wraps(node, vars_, scalars)
            if wraps:
                lo, hi = wraps
                values = ", ".join(f"{n} = {scalars[n]}" for n in given)
                where = " for positions below 2^30" if len(given) < len(vars_) else ""
                return given[0], (f"with {values}, hook '{hook}' computes '{node}' in int32 and it reaches "
                                  f"{hi if hi > _INT32[1] else lo}{where}, past the int32 range (the kernels would "
                                  "wrap, the reference would not)")
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
