"""Inline a variant's hooks into a TIR attention program at its ``attngen_hook_*`` placeholders.

Row hooks read the program's local buffer ``<x>_in`` and write ``<x>_out`` (x = q, k, o);
scalar hooks become expressions. The variant's extra parameters are appended to the
program's signature in declaration order, so every built function has the calling
convention ``(<fixed args>, sm_scale, <extra params...>)``.
"""
from __future__ import annotations

import tvm
import tvm.tirx as tir

from attngen.ir import ConfigError, HOOKS, TensorParam
from attngen.ir import tir_utils as tu

PLACEHOLDER = "attngen_hook_"
ROW_BUFFERS = {"query_transform": "q", "key_transform": "k", "output_transform": "o"}


def specialize_rows(func: tir.PrimFunc, hook: str, head_dim: int, variant: str) -> tir.PrimFunc:
    """Bind the row buffers' symbolic length to ``head_dim``; reject a different fixed length."""
    values = {}
    for row in func.params[:2]:
        n = row.shape[0]
        if isinstance(n, tir.IntImm):
            if n.value != head_dim:
                raise ConfigError(f"variant '{variant}', hook '{hook}': rows are fixed to {n.value} "
                                  f"elements but head_dim={head_dim} was requested; declare the row "
                                  "length symbolic (d = T.int32()) or build for that head_dim")
        else:
            values[tu.handle(n)] = head_dim
    return tu.specialize_shape_vars(func, values)


def canonical_params(variant) -> list:
    """One program-level Var (scalar) or buffer Var (tensor) per declared extra parameter."""
    out = []
    for p in variant.params:
        if isinstance(p, TensorParam):
            shape = [tir.Var(f"{p.name}_dim{i}", "int32") for i in range(len(p.shape))]
            out.append(tir.decl_buffer(shape, p.dtype, name=p.name))
        else:
            out.append(tir.Var(p.name, p.dtype))
    return out


def _extra_mapping(func, spec, canon_by_name) -> dict:
    n_std = (2 if spec.row else 0) + len(spec.scalars)
    mapping = {}
    for p in func.params[n_std:]:
        c = canon_by_name[p.name]
        mapping[tu.handle(p)] = c
        if tir.is_buffer_var(p):
            for mine, theirs in zip(p.shape, c.shape):
                if isinstance(mine, tvm.ir.Var):
                    mapping[tu.handle(mine)] = theirs
    return mapping


def inline_hooks(program: tir.PrimFunc, variant, head_dim: int) -> tir.PrimFunc:
    canon = canonical_params(variant)
    canon_by_name = {c.name: c for c in canon}
    hooks = {}
    for name, func in variant.hooks.items():
        spec = HOOKS[name]
        if spec.row:
            func = specialize_rows(func, name, head_dim, variant.name)
        func = tu.substitute(func, _extra_mapping(func, spec, canon_by_name))
        hooks[name] = func
    local = {a.buffer.name: a.buffer for a in tu.collect(program.body, tir.AllocBuffer)}

    def hook_call(call):
        op = getattr(call, "op", None)
        if op is None or getattr(op, "name", "") != "tirx.call_extern":
            return None
        fname = call.args[0].value
        return fname[len(PLACEHOLDER):] if fname.startswith(PLACEHOLDER) else None

    def on_call(call):
        name = hook_call(call)
        if name is None or HOOKS[name].row:
            return call
        func = hooks[name]
        n_std = len(HOOKS[name].scalars)
        return tu.inline_scalar(func, list(call.args[1:]) + list(func.params[n_std:]))

    def on_evaluate(stmt):
        name = hook_call(stmt.value) if isinstance(stmt.value, tvm.ir.Call) else None
        if name is None:
            return stmt
        func = hooks[name]
        x = ROW_BUFFERS[name]
        n_std = 2 + len(HOOKS[name].scalars)
        args = [local[f"{x}_in"], local[f"{x}_out"]] + list(stmt.value.args[1:]) + list(func.params[n_std:])
        return tu.inline_row(func, args)

    new_body = tu.map_nodes(program.body, tir.Evaluate, on_evaluate)
    new_body = tu.map_nodes(new_body, tvm.ir.Call, on_call)
    leftover = [c for c in tu.collect(new_body, tvm.ir.Call) if hook_call(c)]
    if leftover:
        raise RuntimeError(f"unresolved hook placeholders: {[c.args[0].value for c in leftover]}")
    return tir.PrimFunc(list(program.params) + canon, new_body, program.ret_type, program.attrs)
