"""Mask classification: decide from the mask's TIR which keys a query can see.

The mask's returned expression is simplified, negations are pushed to the
comparisons, and the top-level conjunction is split into atoms. An atom that is
linear in ``d = qo_pos - kv_pos`` with unit coefficient (``kv_pos <= qo_pos``,
``not (kv_pos > qo_pos)``, ``qo_pos - kv_pos < window_left + 1`` ...) becomes a
bound on ``d``; anything else makes the mask arbitrary. Bounds found in a
conjunction are sound for tile skipping even when other atoms are arbitrary.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import tvm
import tvm.sym
import tvm.tirx as tir

from . import tir_utils as tu


class MaskKind(str, enum.Enum):
    NONE = "none"
    CAUSAL = "causal"
    SLIDING_WINDOW = "sliding_window"
    CAUSAL_WINDOW = "causal_window"
    ARBITRARY = "arbitrary"


@dataclass(frozen=True)
class MaskInfo:
    """What templates may assume: every visible key has lower <= qo_pos - kv_pos <= upper."""

    kind: MaskKind
    lower: object | None = None  # PrimExpr over scalar params, or None (unbounded)
    upper: object | None = None
    params: tuple[str, ...] = ()  # extra scalar params the bounds read

    def describe(self) -> str:
        parts = [self.kind.value]
        if self.lower is not None:
            parts.append(f"qo_pos - kv_pos >= {self.lower}")
        if self.upper is not None:
            parts.append(f"qo_pos - kv_pos <= {self.upper}")
        return "; ".join(parts)


def constant_bounds(variant) -> tuple[int | None, int | None]:
    """The mask's bounds lower <= qo_pos - kv_pos <= upper where they are constants (None: unbounded, or set by a
    parameter): the Hopper work order's cost estimate and the CPU kernels' key loops use them."""
    if "logits_mask" not in variant.hooks or variant.analysis.mask.kind == MaskKind.ARBITRARY:
        return None, None

    def const(e):
        value = getattr(e, "value", e)  # (an IntImm, or a Python int)
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    return const(variant.analysis.mask.lower), const(variant.analysis.mask.upper)


def mask_needs_map(variant) -> bool:
    """Whether ``variant``'s mask hook is more than the bounds its analysis found: only then does a tile map skip
    anything, and only then does a library of the variant need the tile-map classifier."""
    return "logits_mask" in variant.hooks and variant.analysis.mask.kind == MaskKind.ARBITRARY


def bounds_are_the_mask(variant) -> bool:
    """Whether the variant has no mask hook, or one its analysis reduced to bounds that are all constants, so
    that a plan counts a kernel's key tiles from the bounds alone (causal, a window of fixed size): the Hopper
    template's split of appends takes those (runtime/work_order.py; the kernels' kHopperMaskedSplit)."""
    if "logits_mask" not in variant.hooks:
        return True
    mask = variant.analysis.mask
    if mask_needs_map(variant):  # (a mask beyond its bounds)
        return False
    lower, upper = constant_bounds(variant)
    return (mask.lower is None or lower is not None) and (mask.upper is None or upper is not None)


_NEGATE = {tir.LT: tir.GE, tir.LE: tir.GT, tir.GT: tir.LE, tir.GE: tir.LT, tir.EQ: tir.NE, tir.NE: tir.EQ}


def _push_not(e, negate=False):
    if isinstance(e, tir.Not):
        return _push_not(e.a, not negate)
    if isinstance(e, (tir.And, tir.Or)):
        a, b = _push_not(e.a, negate), _push_not(e.b, negate)
        flip = isinstance(e, tir.And) == negate
        return tir.Or(a, b) if flip else tir.And(a, b)
    if negate and type(e) in _NEGATE:
        return _NEGATE[type(e)](e.a, e.b)
    if negate:
        return tir.Not(e)
    return e


def _expand_binds(func) -> object:
    binds, value = tu.strip_binds(func.body)
    for b in reversed(binds):
        value = tu.substitute(value, {tu.handle(b.var): b.value})
    return value


def _as_int(x) -> int | None:
    return int(x.value) if isinstance(x, tir.IntImm) else None


def _delta_bound(atom, qo, kv, allowed: dict[int, str]):
    """(lower, upper) bound on d = qo - kv that ``atom`` states exactly, or None."""
    if type(atom) not in (tir.LT, tir.LE, tir.GT, tir.GE, tir.EQ):
        return None
    if "int" not in str(atom.a.ty):
        return None
    diff = atom.a - atom.b
    coeffs = tvm.sym.detect_linear_equation(diff, [qo, kv])
    if len(coeffs) != 3:
        return None
    cq, ck, base = _as_int(coeffs[0]), _as_int(coeffs[1]), coeffs[2]
    if cq is None or ck is None or abs(cq) != 1 or ck != -cq:
        return None
    if any(tu.handle(v) not in allowed for v in tu.used_vars(base)):
        return None
    op = type(atom)
    if cq == -1:  # -(d) + base OP 0  <=>  d + (-base) OP' 0
        base = -base
        op = {tir.LT: tir.GT, tir.LE: tir.GE, tir.GT: tir.LT, tir.GE: tir.LE, tir.EQ: tir.EQ}[op]
    ana = tvm.sym.Analyzer()
    nb = ana.simplify(-base)  # d OP nb
    lo = {tir.GE: nb, tir.GT: ana.simplify(nb + 1), tir.EQ: nb}.get(op)
    hi = {tir.LE: nb, tir.LT: ana.simplify(nb - 1), tir.EQ: nb}.get(op)
    return lo, hi


def classify_mask(func, scalar_param_names: set[str]) -> MaskInfo:
    """Classify a ``logits_mask`` prim_func (None means no mask)."""
    if func is None:
        return MaskInfo(MaskKind.NONE)
    by_name = {p.name: p for p in func.params if not tir.is_buffer_var(p)}
    qo, kv = by_name["qo_pos"], by_name["kv_pos"]
    allowed = {tu.handle(p): p.name for n, p in by_name.items()
               if n in scalar_param_names and "int" in str(p.ty)}
    expr = tu.simplify(_push_not(tu.simplify(_expand_binds(func))))
    if isinstance(expr, tir.IntImm):
        return MaskInfo(MaskKind.NONE) if expr.value else MaskInfo(MaskKind.ARBITRARY)
    lower = upper = None
    exact = True
    for atom in tu.conjuncts(_push_not(expr)):
        bound = _delta_bound(atom, qo, kv, allowed)
        if bound is None:
            exact = False
            continue
        lo, hi = bound
        if lo is not None:
            exact = exact and lower is None
            lower = lo if lower is None else lower
        if hi is not None:
            exact = exact and upper is None
            upper = hi if upper is None else upper
    used = tuple(sorted({allowed[tu.handle(v)] for b in (lower, upper) if b is not None
                         for v in tu.used_vars(b)}))
    kind = MaskKind.ARBITRARY
    if exact:
        causal = lower is not None and _as_int(lower) == 0
        if causal and upper is None:
            kind = MaskKind.CAUSAL
        elif causal:
            kind = MaskKind.CAUSAL_WINDOW
        elif lower is None and upper is not None:
            kind = MaskKind.SLIDING_WINDOW
        elif lower is None and upper is None:
            kind = MaskKind.NONE
    return MaskInfo(kind, lower, upper, used)
