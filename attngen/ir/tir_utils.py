"""Small structural helpers over TVM TIR (walk, substitute, specialise, inline).

TVM 0.27 exposes generic structural walking and mapping through tvm_ffi; these
wrappers give the few operations attngen needs a name. Objects are matched by
identity (their FFI handle), never by ``==``, which builds TIR expressions.
"""
from __future__ import annotations

from typing import Callable, Iterable

import tvm
import tvm.sym
import tvm.tirx as tir
import tvm_ffi


def handle(obj) -> int:
    return obj.__chandle__()


def conjuncts(e) -> list:
    """The operands of a nest of ``And``: [a, b, c] for (a and b) and c; [e] for anything else."""
    return conjuncts(e.a) + conjuncts(e.b) if isinstance(e, tir.And) else [e]


def collect(node, cls) -> list:
    """All sub-objects of ``node`` that are instances of ``cls`` (post-order)."""
    found: list = []
    tvm_ffi.structural_walk(node, (cls, lambda x: found.append(x)))
    return found


def used_vars(node) -> list[tvm.ir.Var]:
    """Vars read (not defined) anywhere in ``node``, in first-use order, deduplicated."""
    seen: dict[int, tvm.ir.Var] = {}

    def on_var(v, kind):
        if kind == tvm_ffi.DefRegionKind.NONE and handle(v) not in seen:
            seen[handle(v)] = v

    tvm_ffi.structural_walk(node, with_def_region_kind=(tvm.ir.Var, on_var))
    return list(seen.values())


def substitute(node, mapping: dict[int, object]):
    """Replace Vars (keyed by :func:`handle`) with the mapped expressions or vars."""
    if not mapping:
        return node
    # Pre-order, so a buffer Var is matched before its type (shape) is rewritten into a new Var.
    return tvm_ffi.structural_map(node, (tvm.ir.Var, lambda v: mapping.get(handle(v), v)), order="pre")


def map_nodes(node, cls, fn: Callable):
    """Post-order rewrite of every ``cls`` node with ``fn`` (returns the node or a replacement)."""
    return tvm_ffi.structural_map(node, (cls, fn))


def source_line(node) -> str | None:
    """``file:line`` of the earliest of ``node`` (a statement or an expression) and the statements
    in it that carries a span, if any."""
    stmts = [node] + collect(node, tir.Stmt)
    spans = [s.span for s in stmts if getattr(s, "span", None) is not None and s.span.line]
    if not spans:
        return None
    first = min(spans, key=lambda sp: sp.line)
    return f"{first.source_name.name}:{first.line}"


def param_dtype(p) -> str:
    return str(p.dtype) if tir.is_buffer_var(p) else str(p.ty)


def specialize_shape_vars(func: tir.PrimFunc, values: dict[int, int]) -> tir.PrimFunc:
    """Bind symbolic shape vars (keyed by handle) to integer constants everywhere."""
    mapping = {h: tir.IntImm("int32", v) for h, v in values.items()}
    return fold_constant_casts(substitute(func, mapping))


def fold_constant_casts(node):
    """Fold casts of integer constants (left behind by substitution) into float/int immediates.

    TVM's integer-set analysis mis-handles ``Cast(float32, IntImm)`` in let bindings, and
    the parser would have folded them had the constant been there from the start.
    """

    def fold(c):
        if not isinstance(c.value, tir.IntImm):
            return c
        dtype = str(c.ty)
        if "float" in dtype:
            return tir.FloatImm(dtype, float(c.value.value))
        if "int" in dtype:
            return tir.IntImm(dtype, int(c.value.value))
        return c

    return tvm_ffi.structural_map(node, (tir.Cast, fold))


def strip_binds(body) -> tuple[list, object]:
    """Split a straight-line scalar hook body into its Bind statements and returned value."""
    stmts = list(body.seq) if isinstance(body, tir.SeqStmt) else [body]
    binds = [s for s in stmts[:-1] if isinstance(s, tir.Bind)]
    last = stmts[-1]
    if len(binds) != len(stmts) - 1 or not isinstance(last, tir.Return):
        raise ValueError("not a straight-line body")
    return binds, last.value


def expand_binds(node):
    """Replace every ``x: T.let = v`` binding in ``node`` by ``v`` at its uses.

    Hooks are pure, so this changes no result; it keeps float-valued lets out of
    TVM's integer-set analysis, which mis-handles casts of bounded loop indices.
    """
    mapping: dict[int, object] = {}
    for b in collect(node, tir.Bind):
        mapping[handle(b.var)] = substitute(b.value, mapping)
    if not mapping:
        return node

    def drop_binds(seq):
        kept = [x for x in seq.seq if not isinstance(x, tir.Bind)]
        return kept[0] if len(kept) == 1 else tir.SeqStmt(kept)

    return substitute(map_nodes(node, tir.SeqStmt, drop_binds), mapping)


def inline_scalar(func: tir.PrimFunc, args: Iterable) -> tvm.ir.PrimExpr:
    """The value a scalar hook returns for ``args``, as one expression."""
    binds, value = strip_binds(func.body)
    mapping: dict[int, object] = {}
    for b in binds:
        mapping[handle(b.var)] = substitute(b.value, mapping)
    value = substitute(value, mapping)
    return substitute(value, {handle(p): a for p, a in zip(func.params, args)})


def inline_row(func: tir.PrimFunc, args: Iterable):
    """The body of a row hook with its params replaced by ``args`` (buffers for buffer params)."""
    mapping = {handle(p): a for p, a in zip(func.params, args)}
    return substitute(expand_binds(func.body), mapping)


def simplify(expr):
    return tvm.sym.Analyzer().simplify(expr)
