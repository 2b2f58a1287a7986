"""Split the logits hook into per-row terms and a per-score remainder, so that templates run only the
part that changes from key to key in their inner loop.

A template applies the logits hook to every score: ``post * logits(s_raw * scale, batch, qo_pos, kv_pos,
qo_head, kv_head, ...)``, where ``scale`` is sm_scale and ``post`` is log2 e for a softmax whose exponent
is base 2. Everything in that expression that reads neither the raw score nor ``kv_pos`` is the same for
every key of a query row: ALiBi's slope ``slopes[qo_head]``, soft-cap's ``1 / cap``, a bias looked up by
head. This module finds those subexpressions (the *row terms*) and rewrites the hook into

* ``row_terms(batch, qo_pos, qo_head, kv_head, scale, post, rt, ...)``: stores each term into ``rt[i]``;
  a template calls it once per query row and work item, before its loop over key tiles;
* ``from_terms(s_raw, batch, qo_pos, kv_pos, qo_head, kv_head, rt, ...)``: the score, reading the terms.

With approximate hook math (``BuildConfig.hook_math == "approx"``) the products are first reassociated
so that the terms absorb ``scale`` and ``post``: a product of two row-invariant factors becomes one term,
``x / c`` becomes ``x * (1 / c)``, and a row-invariant factor distributes over a sum whose parts fold it.
Soft-cap, ``cap * tanh(s / cap)``, becomes ``tanh(s_raw * rt[0]) * rt[1]`` (one multiply, the tanh and
one multiply per score, no division); ALiBi, ``s + slope * (kv_pos - qo_pos)``, becomes ``s_raw * rt[0] +
float(kv_pos - qo_pos) * rt[1]``. Reassociation changes the float32 rounding by an ulp or so, below the
approximations' own error (hook_math.APPROX_MAX_ERROR). Precise hook math only hoists: the same
operations on the same values, bit for bit.

Nothing is hoisted out of an ``if_then_else`` branch (the branch may guard a read that is out of bounds
when not taken); a hook whose body is not straight-line keeps its body, its score scaled and its
value multiplied through two terms.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm.tirx as tir
import tvm_ffi

from attngen.ir import tir_utils as tu

F32 = "float32"
# the row function's standard parameters after (batch, qo_pos, qo_head, kv_head)
ROW_EXTRA = (("scale", F32), ("post", F32))
MAX_TERMS = 8  # a hook with more row-invariant subexpressions keeps the rest per score
_BINARY = (tir.Add, tir.Sub, tir.Mul, tir.Div, tir.Mod, tir.FloorDiv, tir.FloorMod, tir.Min, tir.Max,
           tir.EQ, tir.NE, tir.LT, tir.LE, tir.GT, tir.GE, tir.And, tir.Or)


@dataclass(frozen=True)
class LogitsSplit:
    row: tir.PrimFunc  # (batch, qo_pos, qo_head, kv_head, scale, post, rt[n], <extras>) -> None
    score: tir.PrimFunc  # (s, batch, qo_pos, kv_pos, qo_head, kv_head, rt[n], <extras>) -> float32
    terms: tuple  # the hoisted expressions, rt[i] = terms[i] (over the row function's parameters)
    reassociated: bool

    @property
    def n_terms(self) -> int:
        return len(self.terms)

    @property
    def n_standard(self) -> int:
        """Leading parameters of either function before the variant's extras (the last is ``rt``)."""
        return 7


def _f32(v: float):
    return tir.FloatImm(F32, v)


def _children_mapped(e, f):
    """``e`` rebuilt with ``f`` applied to each child expression (leaves and unknown nodes unchanged;
    the branches of an if_then_else are left as they are)."""
    if isinstance(e, _BINARY):
        return type(e)(f(e.a), f(e.b))
    if isinstance(e, tir.Not):
        return tir.Not(f(e.a))
    if isinstance(e, tir.Cast):
        return tir.Cast(str(e.ty), f(e.value))
    if isinstance(e, tir.Select):
        return tir.Select(f(e.condition), f(e.true_value), f(e.false_value))
    if isinstance(e, tvm.ir.TensorLoad):
        return tir.BufferLoad(e.source, [f(i) for i in e.indices])
    if isinstance(e, tvm.ir.Call) and isinstance(e.op, tvm.ir.Op):
        args = list(e.args)
        if e.op.name.endswith(".if_then_else"):  # its branches are evaluated only when taken
            args = [f(args[0])] + args[1:]
        else:
            args = [f(a) for a in args]
        return tvm.ir.Call(e.op, args, attrs=e.attrs, ret_ty=e.ty)
    return e


class _Splitter:
    def __init__(self, per_score_vars, must_hoist):
        self.per_score = {tu.handle(v) for v in per_score_vars}
        self.must_hoist = {tu.handle(v) for v in must_hoist}  # leaves only the row function has
        self.terms: list = []

    def invariant(self, e) -> bool:
        return not any(tu.handle(v) in self.per_score for v in tu.used_vars(e))

    # ---- reassociation (approximate math only) ----
    def _scaled(self, e) -> bool:
        """A product or quotient by a row-invariant factor (multiplying it by another folds)."""
        return isinstance(e, (tir.Mul, tir.Div)) and self.invariant(e.b) and not self.invariant(e.a)

    def mul(self, a, b):
        if self.invariant(a) and not self.invariant(b):
            a, b = b, a
        if str(a.ty) != F32 or not self.invariant(b) or self.invariant(a):
            return tir.Mul(a, b)
        if isinstance(a, tir.Mul) and self.invariant(a.b):  # (x * c) * b -> x * (c * b)
            return tir.Mul(a.a, tir.Mul(a.b, b))
        if isinstance(a, tir.Div) and self.invariant(a.b):  # (x / c) * b -> x * (b / c)
            return tir.Mul(a.a, tir.Div(b, a.b))
        if isinstance(a, tir.Div) and self.invariant(a.a):  # (c / x) * b -> (c * b) / x
            return tir.Div(tir.Mul(a.a, b), a.b)
        if isinstance(a, (tir.Add, tir.Sub)) and all(self._scaled(x) or self.invariant(x) for x in (a.a, a.b)):
            return type(a)(self.mul(a.a, b), self.mul(a.b, b))
        return tir.Mul(a, b)

    def reassociate(self, e):
        e = _children_mapped(e, self.reassociate)
        if isinstance(e, tir.Mul):
            return self.mul(e.a, e.b)
        if isinstance(e, tir.Div) and str(e.ty) == F32 and self.invariant(e.b) and not self.invariant(e.a):
            return self.mul(e.a, tir.Div(_f32(1.0), e.b))  # x / c -> x * (1 / c)
        return e

    # ---- hoisting ----
    def hoist(self, e, load):
        """``e`` with its maximal row-invariant float32 subexpressions replaced by ``load(i)``."""
        if self.invariant(e) and str(e.ty) == F32 and self._worth(e):
            for i, t in enumerate(self.terms):
                if tvm_ffi.structural_equal(t, e):
                    return load(i)
            if len(self.terms) < MAX_TERMS:
                self.terms.append(e)
                return load(len(self.terms) - 1)
        return _children_mapped(e, lambda c: self.hoist(c, load))

    def _worth(self, e) -> bool:
        """Leaves stay (a parameter or a constant costs nothing), but for those only the row function has."""
        if isinstance(e, tvm.ir.Var):
            return tu.handle(e) in self.must_hoist
        return not isinstance(e, (tir.FloatImm, tir.IntImm))


def split_logits(func: tir.PrimFunc, reassociate: bool) -> LogitsSplit:
    """The row-terms / per-score pair of the logits hook ``func`` (standard parameters: s, batch,
    qo_pos, kv_pos, qo_head, kv_head; the variant's extras after them)."""
    s, batch, qo_pos, kv_pos, qo_head, kv_head = func.params[:6]
    extras = list(func.params[6:])
    s_raw = tir.Var("s", F32)
    scale, post = (tir.Var(n, t) for n, t in ROW_EXTRA)
    sp = _Splitter((s_raw, kv_pos), (scale, post))
    rt_row = tir.decl_buffer((MAX_TERMS,), F32, name="rt")
    rt_score = tir.decl_buffer((MAX_TERMS,), F32, name="rt")

    def load(i):
        return tir.BufferLoad(rt_score, [tir.IntImm("int32", i)])

    try:
        binds, value = tu.strip_binds(func.body)
        straight = True
    except ValueError:
        straight = False
    if straight:
        mapping: dict = {}
        for b in binds:
            mapping[tu.handle(b.var)] = tu.substitute(b.value, mapping)
        value = tu.substitute(tu.substitute(value, mapping), {tu.handle(s): tir.Mul(s_raw, scale)})
        value = tir.Mul(value, post)
        reassoc = reassociate
        if reassoc:
            value = sp.reassociate(value)
        score_body = tir.Return(sp.hoist(value, load))
    else:  # keep the body: the score scaled on the way in, the value multiplied on the way out
        sp.terms = [scale, post]
        reassoc = False
        body = tu.substitute(func.body, {tu.handle(s): tir.Mul(s_raw, load(0))})
        score_body = tu.map_nodes(body, tir.Return, lambda r: tir.Return(tir.Mul(r.value, load(1))))
    terms = tuple(sp.terms)
    stores = [tir.BufferStore(rt_row, t, [tir.IntImm("int32", i)]) for i, t in enumerate(terms)]
    if not stores:  # nothing row-invariant: the function still has a body
        stores = [tir.BufferStore(rt_row, _f32(0.0), [tir.IntImm("int32", 0)])]
    row = tir.PrimFunc([batch, qo_pos, qo_head, kv_head, scale, post, rt_row] + extras,
                       stores[0] if len(stores) == 1 else tir.SeqStmt(stores), None)
    score = tir.PrimFunc([s_raw, batch, qo_pos, kv_pos, qo_head, kv_head, rt_score] + extras, score_body,
                         tvm.ir.PrimType(F32))
    return LogitsSplit(row, score, terms, reassoc)
