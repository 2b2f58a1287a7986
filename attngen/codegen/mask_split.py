"""Split the mask hook into per-row terms and a per-score rest, as logits_split.py does for the logits hook.

A template evaluates the mask hook for every score of a tile it has to check (a partial tile of a tile map,
a tile on a causal diagonal). Reads of tensor parameters whose indices use only row variables (batch,
qo_pos, qo_head, kv_head), such as a packed document mask's ``doc_ids[batch, qo_pos]`` or a prefix-LM's
``prefix_len[batch]``, give the same value for every key of a row. This module turns each such int32 read
into a row term:

* ``row_terms(batch, qo_pos, qo_head, kv_head, rt, ...)`` stores ``rt[i]``; a template calls it once per
  query row and work item, before its loop over key tiles;
* ``from_terms(batch, qo_pos, kv_pos, qo_head, kv_head, rt, ...)`` is the mask, reading the terms.

Where the mask is a conjunction one of whose terms compares a row term with a read indexed by key variables
alone (batch, kv_pos, kv_head), ``rt[i] == doc_ids[batch, kv_pos]``, that read is the mask's key term
(``key(batch, kv_pos, kv_head, ...)``, inside its tensor's bounds as the row terms are): no pair whose two
terms differ is visible, so a tile whose rows' terms and keys' terms share no value is empty. The tile-map
classifier (csrc/tile_map.cuh) compares their ranges before it evaluates a tile.

A mask is a comparison, so nothing is reassociated: the per-score rest computes the same values. A read
may sit under a condition the generated C evaluates lazily (``kv_pos <= qo_pos and doc_ids[...] == ...``),
so its row term reads only inside the tensor's bounds (0 where the indices fall outside, a value no
score then uses: the hook would have read out of bounds there itself).
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm.tirx as tir
import tvm_ffi

from attngen.ir import tir_utils as tu

from .logits_split import _children_mapped

I32 = "int32"
MAX_TERMS = 4


@dataclass(frozen=True)
class MaskSplit:
    row: tir.PrimFunc  # (batch, qo_pos, qo_head, kv_head, rt[n] int32, <extras>) -> None
    score: tir.PrimFunc  # (batch, qo_pos, kv_pos, qo_head, kv_head, rt[n] int32, <extras>) -> bool
    terms: tuple  # rt[i] = terms[i]
    # every read of the per-score rest lies inside its tensor's bounds whatever the positions: a template may
    # evaluate it for any key of a tile, past the request's keys too, and combine it with its own tests
    total: bool = False
    # (batch, kv_pos, kv_head, <extras>) -> int32: the key term a conjunct of the mask compares with rt[key_of]
    # (None: no such conjunct)
    key: tir.PrimFunc | None = None
    key_of: int = -1

    @property
    def n_terms(self) -> int:
        return len(self.terms)

    def per_score(self) -> tuple[list, object]:
        """The per-score rest as its up-front reads ([(var, guarded read)]) and the expression using them."""
        e, reads = self.score.body.value, []
        while isinstance(e, tir.Let):
            reads.append((e.var, e.value))
            e = e.body
        return reads, e

    n_standard_row = 5  # leading parameters before the variant's extras (the last is rt)
    n_standard_score = 6
    n_standard_key = 3


def _key_term(rest, rt, key_vars, extras) -> tuple[tir.PrimFunc | None, int]:
    """The mask's key term: a conjunct ``rt[i] == read`` (either side) of ``rest`` whose read is an int32
    load indexed by ``key_vars`` (batch, kv_pos, kv_head) alone, as a function of them returning the read
    inside its tensor's bounds (0 outside, as a row term), and i; (None, -1) without one."""
    allowed = {tu.handle(v) for v in key_vars}
    for c in tu.conjuncts(rest):
        if not isinstance(c, tir.EQ):
            continue
        for a, b in ((c.a, c.b), (c.b, c.a)):
            if not (isinstance(a, tvm.ir.TensorLoad) and a.source.same_as(rt)):
                continue
            if not isinstance(b, tvm.ir.TensorLoad) or b.source.same_as(rt) or str(b.ty) != I32:
                continue
            if any(tu.collect(i, tvm.ir.TensorLoad) or not all(tu.handle(v) in allowed for v in tu.used_vars(i))
                   for i in b.indices):
                continue
            return (tir.PrimFunc(list(key_vars) + extras, tir.Return(_bounded(b)), tvm.ir.PrimType(I32)),
                    int(a.indices[0].value))
    return None, -1


def _in_bounds(load):
    """The condition under which ``load`` reads inside its tensor."""
    cond = None
    for idx, dim in zip(load.indices, load.source.shape):
        c = tir.And(tir.GE(idx, tir.IntImm(I32, 0)), tir.LT(idx, dim))
        cond = c if cond is None else tir.And(cond, c)
    return cond


def _bounded(load):
    """``load`` where it reads inside its tensor, else 0 of its type."""
    return tir.if_then_else(_in_bounds(load), load, tir.const(0, str(load.ty)))


def _eager_reads(rest, rt) -> tuple:
    """``rest`` with its tensor reads (other than the row terms ``rt``) bound first, each inside its tensor's
    bounds: the generated C evaluates ``kv_pos <= qo_pos && ids[kv_pos] == rt[0]`` lazily, so the read of a
    key's value waited for each score's own condition and was issued once per score; bound up front under
    its bounds alone, it is one read per key for every row of a thread, free to start before the scores
    exist. The value is the same wherever the hook would have read it (0 where it would not have). Returns
    the rewritten rest and whether every read is so bound (else ``rest`` as it was)."""
    reads: list = []

    def bind(e):
        if isinstance(e, tvm.ir.TensorLoad) and not e.source.same_as(rt) \
                and all(not tu.collect(i, tvm.ir.TensorLoad) for i in e.indices):
            for v, t in reads:
                if tvm_ffi.structural_equal(t, e):
                    return v
            reads.append((tir.Var(f"{e.source.name}_read{len(reads)}", str(e.ty)), e))
            return reads[-1][0]
        return _children_mapped(e, bind)

    body = bind(rest)
    if any(not load.source.same_as(rt) for load in tu.collect(body, tvm.ir.TensorLoad)):
        return rest, False  # a read left under a condition (an if_then_else branch, an indirect index)
    if any(tu.collect(body, op) for op in (tir.Div, tir.Mod, tir.FloorDiv, tir.FloorMod)):
        return rest, False  # evaluated for any key or row, a division might divide by a 0 the hook never saw
    for v, load in reversed(reads):
        body = tir.Let(v, _bounded(load), body)
    return body, True


def split_mask(func: tir.PrimFunc) -> MaskSplit | None:
    """The row-terms / per-score pair of the mask hook ``func``; None when its body is not straight-line or
    no read is row-invariant (the templates then call the hook as it is)."""
    batch, qo_pos, kv_pos, qo_head, kv_head = func.params[:5]
    extras = list(func.params[5:])
    try:
        binds, value = tu.strip_binds(func.body)
    except ValueError:
        return None
    mapping: dict = {}
    for b in binds:
        mapping[tu.handle(b.var)] = tu.substitute(b.value, mapping)
    value = tu.substitute(value, mapping)
    rt_row = tir.decl_buffer((MAX_TERMS,), I32, name="rt")
    rt_score = tir.decl_buffer((MAX_TERMS,), I32, name="rt")
    terms: list = []

    def row_invariant(e) -> bool:
        return not any(tu.handle(v) == tu.handle(kv_pos) for v in tu.used_vars(e))

    def hoist(e):
        if isinstance(e, tvm.ir.TensorLoad) and str(e.ty) == I32 and row_invariant(e) \
                and all(not tu.collect(i, tvm.ir.TensorLoad) for i in e.indices):
            for i, t in enumerate(terms):
                if tvm_ffi.structural_equal(t, e):
                    return tir.BufferLoad(rt_score, [tir.IntImm(I32, i)])
            if len(terms) < MAX_TERMS:
                terms.append(e)
                return tir.BufferLoad(rt_score, [tir.IntImm(I32, len(terms) - 1)])
        return _children_mapped(e, hoist)

    rest = hoist(value)
    if not terms:
        return None
    key, key_of = _key_term(rest, rt_score, [batch, kv_pos, kv_head], extras)
    rest, total = _eager_reads(rest, rt_score)
    stores = [tir.BufferStore(rt_row, _bounded(t), [tir.IntImm(I32, i)]) for i, t in enumerate(terms)]
    row = tir.PrimFunc([batch, qo_pos, qo_head, kv_head, rt_row] + extras,
                       stores[0] if len(stores) == 1 else tir.SeqStmt(stores), None)
    score = tir.PrimFunc([batch, qo_pos, kv_pos, qo_head, kv_head, rt_score] + extras, tir.Return(rest),
                         tvm.ir.PrimType("bool"))
    return MaskSplit(row, score, tuple(terms), total, key, key_of)
