"""Which elements of its output row a row hook surely writes: ranges, loop unions, branches.

A statement's writes are a list of :class:`WrittenRange`: elements ``[lo, hi)`` stored whenever
every guard holds. A store writes its one element; an ``if`` guards its branches' ranges by the
condition (and its negation), and keeps what both branches write unguarded; a loop joins the
ranges of its body that touch (``y[2*i]``, ``y[2*i + 1]``), then turns each into a range of the
whole loop when its ends move by the same amount per iteration and consecutive iterations leave
no gap (guards that bound the loop variable narrow the iterations first). Whatever this cannot
follow (a stride, a condition that is not a bound on the loop variable, a loop that may exit
early) is dropped with a note saying why, so the result is always a subset of what the hook
writes. The row is covered when the prover shows that every element lies in some range whose
guards hold.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import tvm
import tvm.sym
import tvm.tirx as tir
import tvm_ffi

from . import tir_utils as tu
from .row_prover import RowProver, uses_var

_MAX_RANGES = 64  # ranges kept per statement; nested branches multiply them


@dataclass(frozen=True)
class WrittenRange:
    lo: tvm.ir.Expr
    hi: tvm.ir.Expr
    guards: tuple = ()  # conditions under which the range is written (all must hold)
    origin: object = None  # the store that writes it, for messages


@dataclass(frozen=True)
class Dropped:
    """A store whose writes the coverage check could not count, and why."""

    origin: object
    reason: str

    def describe(self) -> str:
        where = tu.source_line(self.origin) if self.origin is not None else None
        return f"the store at {where or 'an unknown line'} {self.reason}"


def conjuncts(cond) -> tuple:
    """``cond``'s conjuncts (tir_utils.conjuncts) without the ones that are constantly true."""
    return tuple(c for c in tu.conjuncts(cond) if not (isinstance(c, tir.IntImm) and c.value))


def guard(ranges: list[WrittenRange], cond) -> list[WrittenRange]:
    atoms = conjuncts(cond)
    return [replace(r, guards=r.guards + atoms) for r in ranges]


def merge_branches(then: list[WrittenRange], other: list[WrittenRange], cond, not_cond,
                   prover: RowProver, exact: bool) -> list[WrittenRange]:
    """The writes of ``if cond: then else: other``.

    ``exact``: ``cond`` reads nothing the hook changes and ``not_cond`` is its exact negation, so each
    branch's writes may stay, guarded by them; otherwise only what both branches write is kept.
    """
    both = []
    for p in then:
        for q in other:
            lo, hi = prover.simplify(tir.Max(p.lo, q.lo)), prover.simplify(tir.Min(p.hi, q.hi))
            if not prover.prove(lo >= hi):
                both.append(WrittenRange(lo, hi, p.guards + q.guards, p.origin))
            if len(both) == _MAX_RANGES:  # dropping ranges keeps the result a subset of the writes
                return both
    one_side = guard(then, cond) + guard(other, not_cond) if exact else []
    return (both + one_side)[:_MAX_RANGES]


def _bound_on(atom, var, prover: RowProver):
    """``atom`` as bounds on the integer ``var``: [("lt", e) | ("ge", e)], or None if it is not one."""
    pairs = {tir.LT: lambda a, b: [a - b], tir.LE: lambda a, b: [a - b - 1], tir.GT: lambda a, b: [b - a],
             tir.GE: lambda a, b: [b - a - 1], tir.EQ: lambda a, b: [a - b - 1, b - a - 1]}
    make = pairs.get(type(atom))
    if make is None or "int" not in str(atom.a.ty):
        return None
    bounds = []
    for e in make(atom.a, atom.b):  # each: e < 0, e linear in var
        lin = tvm.sym.detect_linear_equation(e, [var])
        if not lin:
            return None
        coef, base = prover.simplify(lin[0]), lin[1]
        if not isinstance(coef, tir.IntImm) or coef.value == 0:
            return None
        c = coef.value
        if c > 0:  # c*var < -base  <=>  var <= floor((-base - 1) / c)
            bounds.append(("lt", tir.floordiv(-base - 1, c) + 1))
        else:  # -c*var > base  <=>  var > floor(base / -c)
            bounds.append(("ge", tir.floordiv(base, -c) + 1))
    return bounds


@dataclass(frozen=True)
class Loop:
    var: tvm.ir.Var
    lo: tvm.ir.Expr
    extent: tvm.ir.Expr


def loop_union(ranges: list[WrittenRange], loop: Loop, prover: RowProver,
               dropped: list[Dropped]) -> list[WrittenRange]:
    """The writes of the whole loop, given those of one iteration (``ranges``, over ``loop.var``)."""
    out = []
    for r in coalesce(ranges, prover):
        union = _union_one(r, loop, prover)
        if isinstance(union, str):
            dropped.append(Dropped(r.origin, union))
        else:
            out.append(union)
    return out


def coalesce(ranges: list[WrittenRange], prover: RowProver) -> list[WrittenRange]:
    """Ranges with the same guards that touch or overlap joined into one ('y[2*i]', 'y[2*i + 1]')."""
    ranges = list(ranges)
    joined = True
    while joined:
        joined = False
        for a in range(len(ranges)):
            for b in range(len(ranges)):
                p, q = ranges[a], ranges[b]
                if a == b or not tvm_ffi.structural_equal(p.guards, q.guards):
                    continue
                if prover.prove(p.lo <= q.lo) and prover.prove(q.lo <= p.hi):
                    ranges[a] = replace(p, hi=prover.simplify(tir.Max(p.hi, q.hi)))
                    del ranges[b]
                    joined = True
                    break
            if joined:
                break
    return ranges


def _union_one(r: WrittenRange, loop: Loop, prover: RowProver):
    var = loop.var
    first, end = loop.lo, loop.lo + loop.extent
    outer = []
    for atom in r.guards:
        if not uses_var(atom, var):
            outer.append(atom)
            continue
        bounds = _bound_on(atom, var, prover)
        if bounds is None:
            return f"runs only when '{atom}', which is not a bound on loop variable '{var.name}'"
        for kind, e in bounds:
            if kind == "lt":
                end = tir.Min(end, e)
            else:
                first = tir.Max(first, e)
    first, end = prover.simplify(first), prover.simplify(end)
    count = prover.simplify(end - first)
    if not (uses_var(r.lo, var) or uses_var(r.hi, var)):
        lo, hi = r.lo, r.hi
    elif _wraps_around(r, var, count, prover):
        lo, hi = tir.IntImm("int32", 0), r.lo.b
    else:
        lin_lo, lin_hi = tvm.sym.detect_linear_equation(r.lo, [var]), tvm.sym.detect_linear_equation(r.hi, [var])
        if not lin_lo or not lin_hi or not prover.prove(lin_lo[0] == lin_hi[0]):
            return f"has an index that is not linear in loop variable '{var.name}'"
        move, width = prover.simplify(lin_lo[0]), prover.simplify(r.hi - r.lo)
        last = end - 1
        if prover.prove(move > 0) and prover.prove(width >= move):
            lo, hi = tu.substitute(r.lo, {tu.handle(var): first}), tu.substitute(r.hi, {tu.handle(var): last})
        elif prover.prove(move < 0) and prover.prove(width >= -move):
            lo, hi = tu.substitute(r.lo, {tu.handle(var): last}), tu.substitute(r.hi, {tu.handle(var): first})
        else:
            return f"moves by {move} elements per iteration of loop '{var.name}' but stores {width}, leaving gaps"
    if not prover.prove(count >= 1):
        outer.append(count >= 1)
    return WrittenRange(prover.simplify(lo), prover.simplify(hi), tuple(outer), r.origin)


def _wraps_around(r: WrittenRange, var, count, prover: RowProver) -> bool:
    """One element at ``(±var + c) % n`` over at least n consecutive iterations: all of ``[0, n)``."""
    if not isinstance(r.lo, tir.FloorMod) or not prover.prove(r.hi - r.lo == 1):
        return False
    lin = tvm.sym.detect_linear_equation(r.lo.a, [var])
    if not lin or not (prover.prove(lin[0] == 1) or prover.prove(lin[0] == -1)):
        return False
    return prover.prove(r.lo.b > 0) and prover.prove(count >= r.lo.b)


def _holds(r: WrittenRange, k):
    return tir.And(tir.And(r.lo <= k, k < r.hi), all_of(r.guards))


def all_of(atoms):
    """The conjunction of ``atoms`` (true when there are none)."""
    out = tir.IntImm("bool", 1)
    for a in atoms:
        out = a if isinstance(out, tir.IntImm) else tir.And(out, a)
    return out


def covers(ranges: list[WrittenRange], lo, hi, prover: RowProver) -> bool:
    """Whether every element of ``[lo, hi)`` lies in a range whose guards hold."""
    if not ranges:
        return False
    k = tvm.ir.Var("element", "int32")
    prover.bind_range(k, lo, hi - lo)
    claim = _holds(ranges[0], k)
    for r in ranges[1:]:
        claim = tir.Or(claim, _holds(r, k))
    return prover.prove(claim)


def first_gap(ranges: list[WrittenRange], length, prover: RowProver) -> tuple:
    """``(lo, hi)``: a stretch of the row that no unconditional range is shown to write."""
    sure = [r for r in ranges if prover.prove(all_of(r.guards))]
    cur = tir.IntImm("int32", 0)
    for _ in range(len(sure)):
        reach = [r.hi for r in sure if prover.prove(r.lo <= cur) and prover.prove(r.hi > cur)]
        if not reach:
            break
        best = next((h for h in reach if all(prover.prove(h >= o) for o in reach)), reach[0])
        cur = prover.simplify(best)
    later = [r.lo for r in sure if prover.prove(r.lo > cur) and prover.prove(r.lo < length)]
    end = next((lo for lo in later if all(prover.prove(lo <= o) for o in later)), length)
    return cur, prover.simplify(end)
