"""Split the logits hook into per-row terms and a per-score remainder, so that templates run only the
part that changes from key to key in their inner loop.

A template applies the logits hook to every score: ``post * logits(s_raw * scale, batch, qo_pos, kv_pos,
qo_head, kv_head, ...)``, where ``scale`` is sm_scale and ``post`` is log2 e for a softmax whose exponent
is base 2. Everything in that expression that reads neither the raw score nor ``kv_pos`` is the same for
every key of a query row: ALiBi's slope ``slopes[qo_head]``, soft-cap's ``1 / cap``, a bias looked up by
head. This module finds those subexpressions (the *row terms*) and rewrites the hook into

* ``row_terms(batch, qo_pos, qo_head, kv_head, scale, post, rt, ...)``: stores each term into ``rt[i]``;
  a template calls it once per query row and work item, before its loop over key tiles;
* ``from_terms(s_raw, batch, qo_pos, kv_pos, kv_pos_f, qo_head, kv_head, rt, ...)``: the score, reading the
  terms (``kv_pos_f``: the key position as a float, see FLOAT_POSITION_LIMIT).

With approximate hook math (``BuildConfig.hook_math == "approx"``) the products are first reassociated
so that the terms absorb ``scale`` and ``post``: a product of two row-invariant factors becomes one term,
``x / c`` becomes ``x * (1 / c)``, and a row-invariant factor distributes over a sum whose parts fold it.
Soft-cap, ``cap * tanh(s / cap)``, becomes ``tanh(s_raw * rt[0]) * rt[1]`` (one multiply, the tanh and
one multiply per score, no division); ALiBi, ``s + slope * (kv_pos - qo_pos)``, becomes
``s_raw * rt[0] + (kv_pos_f * rt[1] + rt[2])``, two FFMAs (``rt[2]`` is ``-qo_pos * slope * post``).
Reassociation changes the float32 rounding by an ulp or so, below the approximations' own error
(hook_math.APPROX_MAX_ERROR). Precise hook math only hoists: the same operations on the same values,
bit for bit.

An *affine* hook, one whose per-score rest is ``s_raw * a + kv_pos_f * b + c`` with row terms ``a``, ``b``,
``c`` (ALiBi, a bias by head, a scale by head), keeps its terms in that order (``rt[0] = a``, ``rt[1] = b``,
``rt[2] = c``; ``LogitsSplit.affine``): a softmax template then takes the row max of
``y = s_raw + (b / a) * (key - the thread's first key of the tile)`` on an interior tile, one FFMA per score
with a compile-time column offset, and applies ``a`` and the tile's ``b * first key + c`` in the exponent's
FFMA (csrc/score_rules.cuh, ``a > 0`` in every row of a warp, else the general path).

Nothing is hoisted out of what the generated C evaluates only under a condition, an ``if_then_else``
branch, a select's values or the right operand of ``and`` / ``or`` (the condition may guard a read that
is out of bounds when not taken); a hook whose body is not straight-line keeps its body, its score scaled and its
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


# Float key positions: with approximate math, ``float(kv_pos + r)`` (r a row-invariant sum of qo_pos and small
# constants) becomes ``kv_pos_f + float(r)``, where the template passes ``kv_pos_f``, the key's position as a
# float that it counts up per tile instead of converting per score. Exact (the same float as the
# conversion of the int sum, which is rounded once either way) while both addends are below 2^24 in
# magnitude: the runtime refuses key positions from FLOAT_POSITION_LIMIT on for such variants, and the
# constants of r stay below CONSTANT_LIMIT together.
FLOAT_POSITION_LIMIT = 1 << 23
CONSTANT_LIMIT = 1 << 22


@dataclass(frozen=True)
class LogitsSplit:
    row: tir.PrimFunc  # (batch, qo_pos, qo_head, kv_head, scale, post, rt[n], <extras>) -> None
    score: tir.PrimFunc  # (s, batch, qo_pos, kv_pos, kv_pos_f, qo_head, kv_head, rt[n], <extras>) -> float32
    terms: tuple  # the hoisted expressions, rt[i] = terms[i] (over the row function's parameters)
    reassociated: bool
    float_positions: bool = False  # the per-score rest reads kv_pos_f (the key position as a float)
    # the per-score rest is s * rt[0] + (kv_pos_f * rt[1] + rt[2]) (affine_kv) or s * rt[0] + rt[2]
    affine: bool = False
    affine_kv: bool = False
    # the per-score rest is g * rt[post_scale] with rt[post_scale] read nowhere in g (soft-cap's
    # tanh(s * rt[0]) * rt[1]); -1 where it is not (or where the hook math is precise)
    post_scale: int = -1
    # g is a tanh: |g| <= 1, so every logit of a row lies within [-|rt[post_scale]|, |rt[post_scale]|]
    post_bounded: bool = False

    @property
    def n_terms(self) -> int:
        return len(self.terms)

    @property
    def n_standard_row(self) -> int:
        """Leading parameters of the row function before the variant's extras (the last is ``rt``)."""
        return 7

    @property
    def n_standard_score(self) -> int:
        """Leading parameters of the per-score function before the variant's extras (the last is ``rt``)."""
        return 8


def _f32(v: float):
    return tir.FloatImm(F32, v)


def _children_mapped(e, f, lazy: bool = False):
    """``e`` rebuilt with ``f`` applied to each child expression (leaves and unknown nodes unchanged;
    the branches of an if_then_else are left as they are). ``lazy``: also leave alone what the generated
    C evaluates only under a condition, a select's values and the right operand of ``&&`` / ``||``."""
    if lazy and isinstance(e, (tir.And, tir.Or)):
        return type(e)(f(e.a), e.b)
    if isinstance(e, _BINARY):
        return type(e)(f(e.a), f(e.b))
    if isinstance(e, tir.Not):
        return tir.Not(f(e.a))
    if isinstance(e, tir.Cast):
        return tir.Cast(str(e.ty), f(e.value))
    if isinstance(e, tir.Select):
        if lazy:
            return tir.Select(f(e.condition), e.true_value, e.false_value)
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

    def _foldable(self, e) -> bool:
        """A sum whose every part takes a row-invariant factor in at no cost: invariant, a plain variable,
        a product or quotient by an invariant, or such a sum."""
        if isinstance(e, (tir.Add, tir.Sub)):
            return self._foldable(e.a) and self._foldable(e.b)
        return self.invariant(e) or isinstance(e, tvm.ir.Var) or self._scaled(e)

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
        if isinstance(a, (tir.Add, tir.Sub)) and self._foldable(a):
            return type(a)(self.mul(a.a, b), self.mul(a.b, b))  # (x + c) * b -> x * b + c * b: FFMAs
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
        return _children_mapped(e, lambda c: self.hoist(c, load), lazy=True)

    def _worth(self, e) -> bool:
        """Leaves stay (a parameter or a constant costs nothing), but for those only the row function has."""
        if isinstance(e, tvm.ir.Var):
            return tu.handle(e) in self.must_hoist
        return not isinstance(e, (tir.FloatImm, tir.IntImm))


def _kv_linear(e, kv_pos, qo_pos):
    """``(sign, rest)`` with ``e == sign * kv_pos + rest`` when ``e`` is an int32 sum and difference of
    ``kv_pos`` (once), ``qo_pos`` and constants below CONSTANT_LIMIT together; else None."""
    budget = [CONSTANT_LIMIT]

    def rest_ok(x) -> bool:
        if isinstance(x, tir.IntImm):
            budget[0] -= abs(int(x.value))
            return budget[0] > 0
        if isinstance(x, tvm.ir.Var):
            return x.same_as(qo_pos)
        if isinstance(x, (tir.Add, tir.Sub)):
            return rest_ok(x.a) and rest_ok(x.b)
        return False

    def walk(x):
        if isinstance(x, tvm.ir.Var) and x.same_as(kv_pos):
            return 1, tir.IntImm("int32", 0)
        if isinstance(x, (tir.Add, tir.Sub)):
            left, right = walk(x.a), walk(x.b)
            if left and not right and rest_ok(x.b):
                return left[0], type(x)(left[1], x.b)
            if right and not left and rest_ok(x.a):
                sign = right[0] if isinstance(x, tir.Add) else -right[0]
                return sign, type(x)(x.a, right[1])
        return None

    return walk(e) if str(e.ty) == "int32" else None


def _float_positions(value, kv_pos, qo_pos, kv_f):
    """``value`` with each float32 conversion of a sum linear in kv_pos rewritten onto ``kv_f``."""
    hit = [False]

    def conv(c):
        if str(c.ty) != F32:
            return c
        lin = _kv_linear(c.value, kv_pos, qo_pos)
        if lin is None:
            return c
        hit[0] = True
        sign, rest = lin
        rest_f = tir.Cast(F32, rest)
        return tir.Add(kv_f, rest_f) if sign > 0 else tir.Sub(rest_f, kv_f)

    out = tu.map_nodes(value, tir.Cast, conv)
    return out, hit[0] and not any(tu.handle(v) == tu.handle(kv_pos) for v in tu.used_vars(out))


def _affine_parts(e, s_raw, kv_f, invariant):
    """``{"s": coef, "kv": coef, "c": const}`` (coefficients row-invariant, absent parts left out) when ``e``
    is a sum and difference of ``s_raw`` and ``kv_f`` times row-invariant factors and row-invariant terms;
    else None."""
    def parts(x, sign):
        if isinstance(x, tir.Add):
            left, right = parts(x.a, sign), parts(x.b, sign)
            return None if left is None or right is None else left + right
        if isinstance(x, tir.Sub):
            left, right = parts(x.a, sign), parts(x.b, -sign)
            return None if left is None or right is None else left + right
        for var, kind in ((s_raw, "s"), (kv_f, "kv")):
            if isinstance(x, tvm.ir.Var) and x.same_as(var):
                return [(kind, sign, _f32(1.0))]
            if isinstance(x, tir.Mul):
                for v, c in ((x.a, x.b), (x.b, x.a)):
                    if isinstance(v, tvm.ir.Var) and v.same_as(var) and invariant(c):
                        return [(kind, sign, c)]
        if str(x.ty) == F32 and invariant(x):
            return [("c", sign, x)]
        return None

    found = parts(e, 1) if str(e.ty) == F32 else None
    if not found or not any(kind == "s" for kind, _, _ in found):
        return None
    out: dict = {}
    for kind, sign, coef in found:
        term = coef if sign > 0 else tir.Mul(_f32(-1.0), coef)
        out[kind] = tir.Add(out[kind], term) if kind in out else term
    return out


def _affine_split(score_value, terms, s_raw, kv_f, invariant, rt, load):
    """The canonical affine form of a hoisted per-score value (``_affine_parts``; ``invariant``: reads no
    per-score variable): its row terms [a, b, c] over the row function's parameters, the per-score rest
    reading them and whether it has a key term; None where it is not affine."""
    found = _affine_parts(score_value, s_raw, kv_f, invariant)
    if found is None:
        return None
    def row_expr(coef):  # rt[i] loads back to the row function's expressions
        return tu.map_nodes(coef, tvm.ir.TensorLoad,
                            lambda b: terms[int(b.indices[0])] if b.source.same_as(rt) else b)

    new_terms = (row_expr(found["s"]), row_expr(found["kv"]) if "kv" in found else _f32(0.0),
                 row_expr(found["c"]) if "c" in found else _f32(0.0))
    rest = tir.Mul(s_raw, load(0))
    rest = tir.Add(rest, tir.Add(tir.Mul(kv_f, load(1)), load(2))) if "kv" in found else tir.Add(rest, load(2))
    return new_terms, rest, "kv" in found


def _post_scale(score_value, rt) -> tuple[int, object]:
    """(k, g) where ``score_value`` is ``g * rt[k]`` (either order) and ``g`` reads no ``rt[k]``: a softmax
    template then takes the row max of ``g`` and multiplies ``rt[k]`` into the exponent's FFMA
    (csrc/score_rules.cuh apply_post_scaled); else (-1, None)."""
    if not isinstance(score_value, tir.Mul) or str(score_value.ty) != F32:
        return -1, None
    for g, c in ((score_value.a, score_value.b), (score_value.b, score_value.a)):
        if (isinstance(c, tvm.ir.TensorLoad) and c.source.same_as(rt) and len(c.indices) == 1
                and isinstance(c.indices[0], tir.IntImm)):
            k = int(c.indices[0].value)
            reads = []
            tu.map_nodes(g, tvm.ir.TensorLoad, lambda b: reads.append(b) or b)
            if not any(b.source.same_as(rt) and not (isinstance(b.indices[0], tir.IntImm)
                                                     and int(b.indices[0].value) != k) for b in reads):
                return k, g
    return -1, None


def _bounded_by_one(g) -> bool:
    """Whether ``g`` is a tanh (|g| <= 1 for every argument)."""
    return isinstance(g, tvm.ir.Call) and isinstance(g.op, tvm.ir.Op) and g.op.name.split(".")[-1] == "tanh"


def _read_row_leaves(score_value, sp: _Splitter, load):
    """``score_value`` with the row function's own leaves (``scale``, ``post``) that hoisting left in place read
    back from terms: hoisting does not enter what the generated C evaluates only under a condition (a select's
    values, an if_then_else branch), so ``s * scale`` stays there whole, and the score function has no ``scale``.
    A read of ``rt`` is in bounds whether or not the branch is taken. None when the terms run out."""
    left = [v for v in tu.used_vars(score_value) if tu.handle(v) in sp.must_hoist]
    mapping = {}
    for v in left:
        found = [i for i, t in enumerate(sp.terms) if isinstance(t, tvm.ir.Var) and tu.handle(t) == tu.handle(v)]
        if not found:
            if len(sp.terms) >= MAX_TERMS:
                return None
            sp.terms.append(v)
            found = [len(sp.terms) - 1]
        mapping[tu.handle(v)] = load(found[0])
    return tu.substitute(score_value, mapping) if mapping else score_value


def split_logits(func: tir.PrimFunc, reassociate: bool) -> LogitsSplit:
    """The row-terms / per-score pair of the logits hook ``func`` (standard parameters: s, batch,
    qo_pos, kv_pos, qo_head, kv_head; the variant's extras after them)."""
    s, batch, qo_pos, kv_pos, qo_head, kv_head = func.params[:6]
    extras = list(func.params[6:])
    s_raw = tir.Var("s", F32)
    kv_f = tir.Var("kv_pos_f", F32)
    scale, post = (tir.Var(n, t) for n, t in ROW_EXTRA)
    sp = _Splitter((s_raw, kv_pos, kv_f), (scale, post))
    rt_row = tir.decl_buffer((MAX_TERMS,), F32, name="rt")
    rt_score = tir.decl_buffer((MAX_TERMS,), F32, name="rt")

    def load(i):
        return tir.BufferLoad(rt_score, [tir.IntImm("int32", i)])

    affine = None  # (a straight-line hook's canonical affine form, _affine_split)
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
        float_pos = False
        if reassoc:
            # only where every read of kv_pos goes: a hook that also indexes by it keeps the int
            rewritten, float_pos = _float_positions(value, kv_pos, qo_pos, kv_f)
            value = sp.reassociate(rewritten if float_pos else value)
        score_value = _read_row_leaves(sp.hoist(value, load), sp, load)
        straight = score_value is not None
    if straight:
        affine = _affine_split(score_value, sp.terms, s_raw, kv_f, sp.invariant, rt_score, load) if reassoc else None
        if affine is not None:
            sp.terms, score_value, affine_kv = list(affine[0]), affine[1], affine[2]
        score_body = tir.Return(score_value)
        post_scale, g = _post_scale(score_value, rt_score) if reassoc and affine is None else (-1, None)
        post_bounded = post_scale >= 0 and _bounded_by_one(g)
    else:  # keep the body: the score scaled on the way in, the value multiplied on the way out
        sp.terms = [scale, post]
        reassoc = float_pos = False
        post_scale, post_bounded = -1, False
        body = tu.substitute(func.body, {tu.handle(s): tir.Mul(s_raw, load(0))})
        score_body = tu.map_nodes(body, tir.Return, lambda r: tir.Return(tir.Mul(r.value, load(1))))
    terms = tuple(sp.terms)
    stores = [tir.BufferStore(rt_row, t, [tir.IntImm("int32", i)]) for i, t in enumerate(terms)]
    if not stores:  # nothing row-invariant: the function still has a body
        stores = [tir.BufferStore(rt_row, _f32(0.0), [tir.IntImm("int32", 0)])]
    row = tir.PrimFunc([batch, qo_pos, qo_head, kv_head, scale, post, rt_row] + extras,
                       stores[0] if len(stores) == 1 else tir.SeqStmt(stores), None)
    score = tir.PrimFunc([s_raw, batch, qo_pos, kv_pos, kv_f, qo_head, kv_head, rt_score] + extras, score_body,
                         tvm.ir.PrimType(F32))
    return LogitsSplit(row, score, terms, reassoc, float_pos, affine is not None, affine is not None and affine_kv,
                       post_scale, post_bounded)
