"""Hook placeholders in TIR attention programs, and their replacement by a variant's hooks.

A program calls every hook kind of :data:`attngen.ir.HOOKS` at its site through a placeholder
(:func:`hook_call` for scalar hooks, :func:`row_hook_call` for row hooks, which names the local
input and output rows). :func:`inline_hooks` replaces each placeholder by the variant's hook
body, or by the hook kind's identity when the variant has none (a row passes through, a
logits transform returns ``s``, a mask lets every key through). The variant's extra parameters
are appended to the program's signature in declaration order, so every built function has the
calling convention ``(<fixed args>, sm_scale, <extra params...>)``.
"""
from __future__ import annotations

import tvm
import tvm.tirx as tir

from attngen.ir import HOOKS, HookSpec, TensorParam
from attngen.ir import tir_utils as tu
from attngen.ir.specialize import specialize_rows

PLACEHOLDER = "attngen_hook_"


def hook_call(hook: str, *args) -> tir.PrimExpr:
    """Placeholder for the value of scalar hook ``hook`` at its standard arguments ``args``."""
    spec = HOOKS[hook]
    _check_arity(spec, args, row=False)
    return tir.call_extern(spec.returns, PLACEHOLDER + hook, *args)


def row_hook_call(hook: str, row_in, row_out, *args) -> tir.PrimExpr:
    """Placeholder (to ``T.evaluate``) for row hook ``hook`` reading the local buffer ``row_in`` and
    writing ``row_out`` (both float32 [head_dim]), at its standard scalar arguments ``args``."""
    spec = HOOKS[hook]
    _check_arity(spec, args, row=True)
    return tir.call_extern("int32", PLACEHOLDER + hook, row_in, row_out, *args)


def _check_arity(spec: HookSpec, args, row: bool) -> None:
    if spec.row != row or len(args) != len(spec.scalars):
        raise TypeError(f"placeholder for {spec.name}: the template passes {len(args)} standard arguments "
                        f"({'row' if row else 'scalar'} call), the contract is {spec.signature()}")


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


def _extra_mapping(func, spec: HookSpec, canon_by_name) -> dict:
    mapping = {}
    for p in func.params[spec.n_standard:]:
        c = canon_by_name[p.name]
        mapping[tu.handle(p)] = c
        if tir.is_buffer_var(p):
            for mine, theirs in zip(p.shape, c.shape):
                if isinstance(mine, tvm.ir.Var):
                    mapping[tu.handle(mine)] = theirs
    return mapping


def _placeholder_hook(call) -> str | None:
    """The hook kind a placeholder call stands for, or None for any other call."""
    op = getattr(call, "op", None)
    if op is None or getattr(op, "name", "") != "tirx.call_extern":
        return None
    fname = call.args[0].value
    return fname[len(PLACEHOLDER):] if fname.startswith(PLACEHOLDER) else None


def _row_identity(row_in, row_out) -> tir.Stmt:
    """``row_out[i] = row_in[i]`` for every element: an absent row hook."""
    i = tir.Var("i", "int32")
    return tir.For(i, tir.const(0, "int32"), row_out.shape[0], tir.ForKind.SERIAL,
                   tir.BufferStore(row_out, row_in[i], [i]))


def _scalar_identity(spec: HookSpec, args) -> tir.PrimExpr:
    if isinstance(spec.identity, str):
        return args[spec.scalar_names.index(spec.identity)]
    return tir.const(spec.identity, spec.returns)


def inline_hooks(program: tir.PrimFunc, variant, head_dim: int) -> tir.PrimFunc:
    """``program`` with every placeholder replaced (hooks specialised to ``head_dim``) and the
    variant's extra parameters appended to its signature."""
    canon = canonical_params(variant)
    canon_by_name = {c.name: c for c in canon}
    hooks = {}
    for name, func in variant.hooks.items():
        spec = HOOKS[name]
        if spec.row:
            func = specialize_rows(func, name, head_dim, variant.name)
        hooks[name] = tu.substitute(func, _extra_mapping(func, spec, canon_by_name))

    def on_call(call):
        name = _placeholder_hook(call)
        if name is None or HOOKS[name].row:
            return call
        args = list(call.args[1:])
        func = hooks.get(name)
        if func is None:
            return _scalar_identity(HOOKS[name], args)
        return tu.inline_scalar(func, args + list(func.params[HOOKS[name].n_standard:]))

    def on_evaluate(stmt):
        name = _placeholder_hook(stmt.value) if isinstance(stmt.value, tvm.ir.Call) else None
        if name is None:
            return stmt
        row_in, row_out, *scalars = stmt.value.args[1:]  # the program's local row buffers
        func = hooks.get(name)
        if func is None:
            return _row_identity(row_in, row_out)
        return tu.inline_row(func, [row_in, row_out] + scalars + list(func.params[HOOKS[name].n_standard:]))

    new_body = tu.map_nodes(program.body, tir.Evaluate, on_evaluate)
    new_body = tu.map_nodes(new_body, tvm.ir.Call, on_call)
    leftover = [c for c in tu.collect(new_body, tvm.ir.Call) if _placeholder_hook(c)]
    if leftover:
        raise RuntimeError(f"unresolved hook placeholders: {[c.args[0].value for c in leftover]}")
    return tir.PrimFunc(list(program.params) + canon, new_body, program.ret_type, program.attrs)
