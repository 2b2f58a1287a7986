"""Split the mask hook into per-row terms and a per-score rest, as logits_split.py does for the logits hook.

A template evaluates the mask hook for every score of a tile it has to check (a partial tile of a tile map,
a tile on a causal diagonal). Reads of tensor parameters whose indices use only row variables (batch,
qo_pos, qo_head, kv_head), such as a packed document mask's ``doc_ids[batch, qo_pos]`` or a prefix-LM's
``prefix_len[batch]``, give the same value for every key of a row. This module turns each such int32 read
into a row term:

* ``row_terms(batch, qo_pos, qo_head, kv_head, rt, ...)`` stores ``rt[i]``; a template calls it once per
  query row and work item, before its loop over key tiles;
* ``from_terms(batch, qo_pos, kv_pos, qo_head, kv_head, rt, ...)`` is the mask, reading the terms.

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

    @property
    def n_terms(self) -> int:
        return len(self.terms)

    n_standard_row = 5  # leading parameters before the variant's extras (the last is rt)
    n_standard_score = 6


def _in_bounds(load):
    """The condition under which ``load`` reads inside its tensor."""
    cond = None
    for idx, dim in zip(load.indices, load.source.shape):
        c = tir.And(tir.GE(idx, tir.IntImm(I32, 0)), tir.LT(idx, dim))
        cond = c if cond is None else tir.And(cond, c)
    return cond


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
    stores = [tir.BufferStore(rt_row, tir.if_then_else(_in_bounds(t), t, tir.IntImm(I32, 0)), [tir.IntImm(I32, i)])
              for i, t in enumerate(terms)]
    row = tir.PrimFunc([batch, qo_pos, qo_head, kv_head, rt_row] + extras,
                       stores[0] if len(stores) == 1 else tir.SeqStmt(stores), None)
    score = tir.PrimFunc([batch, qo_pos, kv_pos, qo_head, kv_head, rt_score] + extras, tir.Return(rest),
                         tvm.ir.PrimType("bool"))
    return MaskSplit(row, score, tuple(terms))
