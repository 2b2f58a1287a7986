"""A small NumPy interpreter for hook TIR, in float64, vectorised over rows or scores.

It is the reference path: it shares nothing with TVM's code generators, so a hook
evaluated here and the same hook compiled into a kernel are two independent
readings of the variant. Scalars bound to arrays broadcast; row buffers are
``[..., d]`` arrays indexed on their last axis.
"""
from __future__ import annotations

import math

import numpy as np
import tvm
import tvm.tirx as tir

from . import tir_utils as tu
from .hook_calls import extern_base_name
from .hook_spec import HOOKS

_UNARY = {
    "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(10.0, x), "log": np.log,
    "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "tanh": np.tanh, "sin": np.sin, "cos": np.cos, "tan": np.tan, "sinh": np.sinh, "cosh": np.cosh,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "erf": None, "floor": np.floor, "ceil": np.ceil,
    "round": np.round, "trunc": np.trunc, "fabs": np.abs, "abs": np.abs, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite, "bitwise_not": np.invert,
}
_BINARY = {
    "pow": np.power, "atan2": np.arctan2, "fmod": np.fmod, "hypot": np.hypot, "copysign": np.copysign,
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
    "shift_left": np.left_shift, "shift_right": np.right_shift, "nextafter": np.nextafter,
}
_ARITH = {
    tir.Add: np.add, tir.Sub: np.subtract, tir.Mul: np.multiply, tir.Min: np.minimum, tir.Max: np.maximum,
    tir.EQ: np.equal, tir.NE: np.not_equal, tir.LT: np.less, tir.LE: np.less_equal, tir.GT: np.greater,
    tir.GE: np.greater_equal, tir.And: np.logical_and, tir.Or: np.logical_or,
    tir.FloorDiv: np.floor_divide, tir.FloorMod: np.mod, tir.BitwiseAnd: np.bitwise_and,
    tir.BitwiseOr: np.bitwise_or, tir.BitwiseXor: np.bitwise_xor, tir.LShift: np.left_shift,
    tir.RShift: np.right_shift,
}


class UnsupportedByReference(ValueError):
    """A hook uses a TIR construct the reference interpreter does not evaluate."""


def _is_float(dtype) -> bool:
    return "float" in str(dtype)


def _np_dtype(dtype):
    d = str(dtype)
    if d == "bool":
        return np.bool_
    return np.float64 if "float" in d else np.int64


class TIREvaluator:
    """Evaluates expressions and (row-hook) statements with an environment keyed by Var handle."""

    def __init__(self, env: dict[int, object]):
        self.env = dict(env)
        self.clip_loads = 0  # >0 while evaluating both sides of a vector select

    def _select(self, cond, then, other):
        c = self.expr(cond)
        if np.ndim(c) == 0:  # TIR selects lazily; a scalar condition lets us do the same
            return self.expr(then) if bool(c) else self.expr(other)
        self.clip_loads += 1
        try:
            return np.where(c, self.expr(then), self.expr(other))
        finally:
            self.clip_loads -= 1

    def expr(self, e):
        if isinstance(e, (tir.IntImm,)):
            return np.bool_(e.value) if str(e.ty) == "bool" else np.int64(e.value)
        if isinstance(e, tir.FloatImm):
            return np.float64(e.value)
        if isinstance(e, tvm.ir.Var):
            return self.env[tu.handle(e)]
        if type(e) in _ARITH:
            return _ARITH[type(e)](self.expr(e.a), self.expr(e.b))
        if isinstance(e, (tir.Div, tir.Mod)):
            a, b = self.expr(e.a), self.expr(e.b)
            if _is_float(e.ty):
                return a / b if isinstance(e, tir.Div) else np.fmod(a, b)
            q = np.trunc(np.divide(a, b)).astype(np.int64)
            return q if isinstance(e, tir.Div) else a - q * b
        if isinstance(e, tir.BitwiseNot):
            return np.invert(self.expr(e.a))
        if isinstance(e, tir.Not):
            return np.logical_not(self.expr(e.a))
        if isinstance(e, tir.Cast):
            return np.asarray(self.expr(e.value)).astype(_np_dtype(e.ty))
        if isinstance(e, tir.Select):
            return self._select(e.condition, e.true_value, e.false_value)
        if isinstance(e, tir.Let):
            self.env[tu.handle(e.var)] = self.expr(e.value)
            return self.expr(e.body)
        if isinstance(e, tvm.ir.TensorLoad):
            return self._load(e)
        if isinstance(e, tvm.ir.Call):
            return self._call(e)
        raise UnsupportedByReference(f"reference evaluator: unsupported TIR node {type(e).__name__}: {e}")

    def _load(self, e):
        arr = self.env[tu.handle(e.source)]
        idx = tuple(np.asarray(self.expr(i)).astype(np.int64) for i in e.indices)
        data = arr.data if getattr(arr, "_row", False) else np.asarray(arr)
        if self.clip_loads:  # the lane that reads out of range is discarded by the select
            shape = data.shape[-1:] if getattr(arr, "_row", False) else data.shape
            idx = tuple(np.clip(i, 0, max(n - 1, 0)) for i, n in zip(idx, shape))
        if getattr(arr, "_row", False):
            return data[..., idx[0]]
        return data[idx]

    def _call(self, e):
        name = e.op.name.split(".")[-1]
        args = e.args
        if name == "if_then_else":
            return self._select(args[0], args[1], args[2])
        if name in ("call_pure_extern",):
            name = extern_base_name(str(e.ty), args[0].value)
            args = args[1:]
        vals = [self.expr(a) for a in args]
        if name in _UNARY and _UNARY[name] is not None:
            return _UNARY[name](vals[0])
        if name == "erf":
            return np.vectorize(math.erf)(vals[0])
        if name in _BINARY:
            return _BINARY[name](*vals)
        if name in ("likely", "assume"):
            return vals[0]
        raise UnsupportedByReference(f"reference evaluator: unsupported call {e.op.name}")

    def stmt(self, s):
        if isinstance(s, tir.SeqStmt):
            for x in s.seq:
                self.stmt(x)
        elif isinstance(s, tir.For):
            lo, n = int(self.expr(s.min)), int(self.expr(s.extent))
            for i in range(lo, lo + n):
                self.env[tu.handle(s.loop_var)] = np.int64(i)
                self.stmt(s.body)
        elif isinstance(s, tir.Bind):
            self.env[tu.handle(s.var)] = self.expr(s.value)
        elif isinstance(s, tir.BufferStore):
            row = self.env[tu.handle(s.buffer)]
            (i,) = [int(self.expr(x)) for x in s.indices]
            row.data[..., i] = self.expr(s.value)
        elif isinstance(s, tir.IfThenElse):
            cond = np.asarray(self.expr(s.condition))
            if cond.ndim:
                raise UnsupportedByReference("reference evaluator: data-dependent 'if' in a row hook; "
                                          "use T.if_then_else in the stored expression")
            if cond:
                self.stmt(s.then_case)
            elif s.else_case is not None:
                self.stmt(s.else_case)
        elif isinstance(s, (tir.Evaluate, tir.DeclBuffer)):
            pass
        else:
            raise UnsupportedByReference(f"reference evaluator: unsupported statement {type(s).__name__}")


class RowArray:
    """A batch of rows ``[..., d]`` bound to a row-buffer parameter."""

    _row = True

    def __init__(self, data: np.ndarray):
        self.data = data


def bind_params(func: tir.PrimFunc, values: list, extras: dict[str, object]) -> dict[int, object]:
    """Environment for ``func``: leading params from ``values``, the rest from ``extras`` by name."""
    env = {}
    for p, v in zip(func.params, values):
        env[tu.handle(p)] = v
    for p in func.params[len(values):]:
        val = extras[p.name]
        env[tu.handle(p)] = np.asarray(val) if tir.is_buffer_var(p) else val
        if tir.is_buffer_var(p):
            for dim, n in zip(p.shape, np.shape(val)):
                if isinstance(dim, tvm.ir.Var):
                    env[tu.handle(dim)] = np.int64(n)
    return env


def eval_scalar_hook(func: tir.PrimFunc, args: list, extras: dict[str, object]):
    """Evaluate a scalar hook with (broadcastable) array arguments."""
    ev = TIREvaluator(bind_params(func, args, extras))
    binds, value = tu.strip_binds(func.body)
    for b in binds:
        ev.stmt(b)
    return ev.expr(value)


def eval_row_hook(func: tir.PrimFunc, rows: np.ndarray, args: list, extras: dict[str, object]) -> np.ndarray:
    """Apply a row hook to ``rows[..., d]`` (scalar args broadcast over the leading dims)."""
    out = RowArray(np.full(rows.shape, np.nan, dtype=np.float64))
    env = bind_params(func, [RowArray(rows.astype(np.float64)), out] + list(args), extras)
    d = rows.shape[-1]
    for row in func.params[:2]:
        n = row.shape[0]
        if isinstance(n, tvm.ir.Var):
            env[tu.handle(n)] = np.int64(d)
    TIREvaluator(env).stmt(func.body)
    return out.data


def apply_hook(variant, hook: str, env: dict[str, object], extras: dict[str, object], row: np.ndarray | None = None):
    """The value of ``variant``'s ``hook`` (its identity when the variant has none) at one site.

    ``env`` holds the hook's standard scalar arguments by name (arrays broadcast against each other);
    a row hook maps ``row[..., d]``, a scalar hook returns its value.
    """
    spec = HOOKS[hook]
    func = variant.hooks.get(hook)
    if func is None:
        if spec.row:
            return row
        return env[spec.identity] if isinstance(spec.identity, str) else np.asarray(spec.identity)
    args = [env[n] for n in spec.scalar_names]
    if spec.row:
        return eval_row_hook(func, row, args, extras)
    return eval_scalar_hook(func, args, extras)
