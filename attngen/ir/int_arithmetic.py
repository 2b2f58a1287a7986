"""Integer arithmetic of hooks that the kernels and the reference would read differently: refused when the
variant is made, or for the values of its scalar parameters (per call, when folded, and their defaults).

Wrapping. A hook's ``qo_pos`` and ``kv_pos`` are int32. The kernels compute a hook's int32 arithmetic in
int32, the reference interpreter in int64 (ir/tir_eval.py), and the mask analysis simplifies as if nothing
overflowed (``kv_pos * 1000000 <= qo_pos * 1000000`` reads as causal): a product or sum that wraps in the
kernel would be three different answers. Every request the runtime accepts has fewer than
:data:`MAX_POSITION` queries and keys (runtime/checks.py refuses longer ones), so every position lies strictly
between -MAX_POSITION and MAX_POSITION (a key's in ``[0, MAX_POSITION)``; a query's is ``kv_len - qo_len + i``,
negative where a request has more queries than keys); an int32 sub-expression of positions and constants
whose range under that bound leaves int32 is refused, with the int64 cast that computes it exactly; so is a
wider integer of positions cast to int32 whose value can leave int32 (the kernels truncate it, the reference
does not). Sub-expressions that also read integer scalar parameters are checked per call, with the values
given (:func:`parameter_problem`, from runtime/params.py): a window of 2^31 - 1 passed to
``qo_pos - kv_pos < window + 1`` would wrap to an empty window in the kernels alone.

Dividing by zero. An integer division or remainder by a parameter (``qo_pos // chunk``) given 0 stops the
CPU library's process (SIGFPE), leaves the GPU's result undefined and gives the reference 0: the value is
refused per call, and by ``Variant.with_constants``. A division by a term of positions that is 0 for some
position (``100 // (qo_pos - kv_pos)``) is refused when the variant is made, unless it sits in a branch of a
``T.if_then_else`` (which evaluates one branch only).

Casting floats to integers. A float parameter whose cast to an integer type cannot hold it
(``T.Cast("int32", width)`` at 1e10, or inf) is refused per call: the CPU, the GPU and the reference would each
give another integer.
"""
from __future__ import annotations

import math

import tvm
import tvm.sym
import tvm.tirx as tir

from . import tir_utils as tu
from .declarations import INT_RANGES
from .errors import VariantError
from .hook_calls import op_name
from .hook_spec import POSITIONS

MAX_POSITION = 2**29  # |position| < MAX_POSITION: requests hold fewer queries and keys than this
_POSITIONS_IN = "within +-2^29"  # (how messages say it)
_INT32 = INT_RANGES["int32"]
_ARITH = (tir.Add, tir.Sub, tir.Mul, tir.LShift)
_DIVISIONS = (tir.FloorDiv, tir.FloorMod, tir.Div, tir.Mod)
# a key's position is its index in the request; a query's is kv_len - qo_len + i (negative where a request has more
# queries than keys)
_POSITION_RANGE = {"kv_pos": tvm.ir.Range(0, MAX_POSITION), "qo_pos": tvm.ir.Range(-MAX_POSITION + 1, MAX_POSITION)}


def _reading_only(func, types, names: set[str], picked, exclude=None):
    """(node, its picked sub-expression, that expression's vars by name) for every node of ``types`` in ``func``
    (lets expanded, innermost first; not those whose handles ``exclude(body)`` gives) where ``picked(node)`` gives
    an expression (None: the node is not of the kind sought) that reads only the scalar arguments ``names`` (at
    least one) and constants."""
    by_handle = {tu.handle(p): p for p in func.params if not tir.is_buffer_var(p) and p.name in names}
    body = tu.expand_binds(func.body)
    skipped = exclude(body) if exclude is not None else set()
    for node in tu.collect(body, types):
        expr = None if tu.handle(node) in skipped else picked(node)
        if expr is None:
            continue
        used = {tu.handle(v) for v in tu.used_vars(expr)}
        if used and used <= set(by_handle):
            yield node, expr, {by_handle[h].name: by_handle[h] for h in used}


def _int32_term(node):
    """An int32 sum, difference, product or shift itself, or the wider integer an int32 cast narrows."""
    if str(node.ty) != "int32":
        return None
    if isinstance(node, tir.Cast):
        return node.value if "int" in str(node.value.ty) and str(node.value.ty) != "int32" else None
    return node


def _int32_terms(func, names: set[str]):
    """(term, its vars by name, whether it is cast) for every int32 sum, difference, product or shift of
    ``func``, and every cast of a wider integer to int32 (the term: the value cast), that reads only the scalar
    arguments ``names`` and constants, innermost first (lets expanded)."""
    for node, term, vars_ in _reading_only(func, _ARITH + (tir.Cast,), names, _int32_term):
        yield term, vars_, isinstance(node, tir.Cast)


def _wraps(node, vars_: dict, values: dict) -> tuple[int, int] | None:
    """The range of ``node`` with positions strictly within +-MAX_POSITION and the other vars at ``values``, where it
    leaves int32; None where it stays inside."""
    ana = tvm.sym.Analyzer()
    fixed = {}
    for name, var in vars_.items():
        if name in POSITIONS:
            ana.bind(var, _POSITION_RANGE[name])
        else:
            fixed[tu.handle(var)] = tir.IntImm("int64", int(values[name]))
    if fixed:  # (values in int64: the bound is of the term's mathematical value)
        node = tu.substitute(node, fixed)
    b = ana.const_int_bound(node)
    return (int(b.min_value), int(b.max_value)) if b.min_value < _INT32[0] or b.max_value > _INT32[1] else None


def position_overflow(func) -> tuple[object, tuple[int, int], bool] | None:
    """The first (innermost) int32 sub-expression of ``func``'s positions and constants whose range leaves
    int32 for positions within +-:data:`MAX_POSITION` (or is cast to int32), with that range and whether it is cast;
    None if there is none."""
    for node, vars_, cast in _int32_terms(func, set(POSITIONS)):
        wraps = _wraps(node, vars_, {})
        if wraps:
            return node, wraps, cast
    return None


def _guarded(body) -> set[int]:
    """Handles of the divisions inside a branch of a ``T.if_then_else`` of ``body`` (only one branch is evaluated,
    in both code generators and the reference)."""
    inside: set[int] = set()
    for call in tu.collect(body, tvm.ir.Call):
        if op_name(call) == "if_then_else":
            for branch in call.args[1:]:
                inside |= {tu.handle(n) for n in tu.collect(branch, _DIVISIONS)}
    return inside


def _int_divisor(node):
    """The divisor of an integer division or remainder."""
    return node.b if "int" in str(node.ty) else None


def _divisions_by(func, names: set[str]):
    """(division, its divisor's vars by name) for every integer division or remainder of ``func`` outside any
    ``T.if_then_else`` branch whose divisor reads only the scalar arguments ``names`` (at least one) and
    constants (lets expanded)."""
    for node, _, vars_ in _reading_only(func, _DIVISIONS, names, _int_divisor, exclude=_guarded):
        yield node, vars_


def position_divisor(func):
    """The first integer division or remainder of ``func`` by a term of positions and constants that is 0 for
    some positions within +-MAX_POSITION, outside any ``T.if_then_else`` branch; None if there is none."""
    for node, vars_ in _divisions_by(func, set(POSITIONS)):
        ana = tvm.sym.Analyzer()
        for name, var in vars_.items():
            ana.bind(var, _POSITION_RANGE[name])
        b = ana.const_int_bound(node.b)
        if b.min_value <= 0 <= b.max_value:
            return node
    return None


def _zero_divisor(func, ints: set[str], scalars: dict):
    """(division, parameters) for the first integer division or remainder of ``func`` whose divisor reads only
    the integer parameters ``ints`` (at least one) and constants and is 0 at ``scalars``, outside any
    ``T.if_then_else`` branch; None if none is."""
    for node, vars_ in _divisions_by(func, ints):
        value = tvm.sym.Analyzer().simplify(tu.substitute(
            node.b, {tu.handle(var): tir.IntImm("int64", int(scalars[name])) for name, var in vars_.items()}))
        if isinstance(value, tir.IntImm) and value.value == 0:
            return node, sorted(vars_)
    return None


def _float_to_int(node):
    """The float a cast to an integer type converts."""
    return node.value if "int" in str(node.ty) and "float" in str(node.value.ty) else None


def _float_to_int_overflow(func, floats: set[str], scalars: dict):
    """(cast, parameters, value) for the first cast of ``func`` from a float term of the float parameters
    ``floats`` (at least one) and constants to an integer type whose value at ``scalars`` is not finite or does
    not fit that type; None if none is."""
    for node, value, vars_ in _reading_only(func, tir.Cast, floats, _float_to_int):
        value = tvm.sym.Analyzer().simplify(tu.substitute(
            value, {tu.handle(var): tir.FloatImm("float64", float(scalars[name])) for name, var in vars_.items()}))
        if not isinstance(value, tir.FloatImm):
            continue
        lo, hi = INT_RANGES.get(str(node.ty), _INT32)
        v = float(value.value)
        if not math.isfinite(v) or not lo <= math.trunc(v) <= hi:
            return node, sorted(vars_), v
    return None


def _hook_problem(hook: str, func, ints: set[str], floats: set[str], scalars: dict):
    """(parameters at fault, what the hook does with them, the value wanted) for ``func``'s first problem at
    ``scalars`` (parameter_problem's three kinds); None if it has none."""
    bad_cast = _float_to_int_overflow(func, floats, scalars) if floats else None
    if bad_cast:
        node, names, v = bad_cast
        return names, (f"hook '{hook}' casts {v:g} to {node.ty} in '{node}', which it cannot hold (the CPU "
                       "library, the GPU and the reference would each give another integer)"), \
            f"a value whose cast fits {node.ty}"
    if not ints:
        return None
    zero = _zero_divisor(func, ints, scalars)
    if zero:
        node, names = zero
        return names, (f"hook '{hook}' divides by 0 in '{node}' (the CPU library's process would stop, the GPU's "
                       "result is undefined)"), "a non-zero value"
    for node, vars_, cast in _int32_terms(func, ints | set(POSITIONS)):
        given = sorted(set(vars_) & ints)
        wraps = _wraps(node, vars_, scalars) if given else None
        if wraps:
            lo, hi = wraps
            where = f" for positions {_POSITIONS_IN}" if len(given) < len(vars_) else ""
            verb = f"casts '{node}' to int32" if cast else f"computes '{node}' in int32"
            return given, (f"hook '{hook}' {verb} and it reaches {hi if hi > _INT32[1] else lo}{where}, past the "
                           "int32 range (the kernels would wrap, the reference would not)"), \
                "a value that keeps the term inside int32"
    return None


def checked_parameters(variant) -> tuple[str, ...]:
    """The scalar parameters :func:`parameter_problem` looks at (sorted): those in an int32 term, an integer
    divisor or a float cast to an integer of some hook. A call's values of the others cannot make a problem, so
    a per-call check keys on these alone (none: nothing to check)."""
    ints = {p.name for p in variant.scalar_params if "int" in str(p.dtype)}
    floats = {p.name for p in variant.scalar_params if "float" in str(p.dtype)}
    found: set[str] = set()
    for func in variant.hooks.values():
        for _, vars_, _ in _int32_terms(func, ints | set(POSITIONS)):
            found |= set(vars_) & ints
        for _, vars_ in _divisions_by(func, ints):
            found |= set(vars_)
        for _, _, vars_ in _reading_only(func, tir.Cast, floats, _float_to_int):
            found |= set(vars_)
    return tuple(sorted(found))


def parameter_problem(variant, scalars: dict) -> tuple[str, str, str] | None:
    """(parameter, why, the value wanted) where the integer scalar parameter values ``scalars`` (name: value)
    make an int32 term of ``variant``'s hooks (positions, those parameters and constants) leave int32 for
    positions within +-MAX_POSITION, or make a divisor of parameters and constants 0, or where float parameter
    values make a cast to an integer type overflow; None if they do none of these."""
    ints = {p.name for p in variant.scalar_params if "int" in str(p.dtype)} & set(scalars)
    floats = {p.name for p in variant.scalar_params if "float" in str(p.dtype)} & set(scalars)
    for hook, func in variant.hooks.items():
        found = _hook_problem(hook, func, ints, floats, scalars)
        if found:
            names, what, wanted = found
            return names[0], f"with {', '.join(f'{n} = {scalars[n]}' for n in names)}, {what}", wanted
    return None


def check_position_arithmetic(variant: str, hook: str, func) -> None:
    """Raise :class:`VariantError` when ``func`` (a hook) has int32 arithmetic on positions that can wrap, or
    divides by a term of positions that can be 0 outside a ``T.if_then_else`` branch."""
    division = position_divisor(func)
    if division is not None:
        raise VariantError(
            variant, hook, f"'{division}' divides by '{division.b}', which is 0 for some positions (the CPU "
            "library's process would stop, the GPU's result is undefined)",
            f"divide only where it is not 0 (T.if_then_else({division.b} != 0, ..., ...)) or by a term that cannot "
            "be 0", tu.source_line(division))
    found = position_overflow(func)
    if found is None:
        return
    node, (lo, hi), cast = found
    raise VariantError(
        variant, hook,
        f"'{node}' is {'cast to ' if cast else ''}int32 and reaches {hi if hi > _INT32[1] else lo} for positions "
        f"{_POSITIONS_IN}, past the int32 range: the kernels would wrap where the reference does not",
        "keep it in int64 where it is compared or used" if cast else
        "compute it in int64 (T.Cast('int64', kv_pos) * ...), or keep the arithmetic on qo_pos - kv_pos",
        tu.source_line(node))
