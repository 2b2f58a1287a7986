"""`Variant`: an attention variant defined by its TIR hooks, extra parameters and state algebra."""
from __future__ import annotations

import hashlib
import inspect
import sys
from functools import cached_property

import tvm.tirx as tir

from . import tir_utils as tu
from .analysis import VariantAnalysis, analyze_variant
from .declarations import Param, ScalarParam, StateAlgebra, TensorParam, scalar_value
from .errors import VariantError
from .hook_spec import HOOK_ORDER
from .int_arithmetic import parameter_problem
from .validate import check_hook_names, check_params_argument, validate_variant


class Variant:
    """An attention variant: name, hooks (TVMScript prim_funcs), extra params, state algebra.

    Each hook is passed by its name in :data:`attngen.ir.HOOKS` (``query_transform=...``,
    ``logits_mask=...``, ...). Hooks left out are the identity (no transform, no mask).
    Construction runs every check of :mod:`attngen.ir.validate` and raises
    :class:`VariantError` on the first problem found.
    """

    def __init__(
        self,
        name: str,
        *,
        params: tuple[Param, ...] | list[Param] = (),
        state: StateAlgebra | str = StateAlgebra.SOFTMAX,
        doc: str = "",
        **hooks: tir.PrimFunc | None,
    ):
        check_hook_names(name, hooks)
        check_params_argument(name, params)
        self.name = name
        self.hooks: dict[str, tir.PrimFunc] = {k: hooks[k] for k in HOOK_ORDER if hooks.get(k) is not None}
        self.params: tuple[Param, ...] = tuple(params)
        self.state = state
        self.doc = doc
        # the caller's frame alone: inspect.stack() would read the source lines of every frame on the stack
        # (15 ms a variant under a test runner's stack)
        caller = sys._getframe(1)
        self.defined_at = f"{caller.f_code.co_filename}:{caller.f_lineno}"
        self.constants: dict[str, int | float] = {}  # scalar parameters compiled in (with_constants)
        validate_variant(self)
        self.state = StateAlgebra(state)

    def with_constants(self, **values) -> "Variant":
        """This variant with scalar parameters compiled in: each named parameter's value is substituted into
        the hooks (and folded there, e.g. a soft-cap's division becomes a multiply by a constant) and the
        parameter leaves the list, so calls no longer pass it. A build specialises on the values (the IR
        text, and so the cache key, holds them); ``constants`` lists what was folded."""
        folded = {}
        for name, value in values.items():
            p = self.param(name)
            if not isinstance(p, ScalarParam):
                kind = "a tensor parameter" if p is not None else "not a parameter"
                raise VariantError(self.name, None, f"with_constants({name}=...): '{name}' is {kind}",
                                   f"fold one of the scalar parameters {[q.name for q in self.scalar_params]}")
            v, problem = scalar_value(p.dtype, value)
            if problem:
                raise VariantError(self.name, None, f"with_constants({name}=...) ({p.dtype}): {problem}",
                                   f"pass a value {p.dtype} holds")
            folded[name] = (v, p.dtype)
        bad = parameter_problem(self, {k: v for k, (v, _) in folded.items()})
        if bad:
            raise VariantError(self.name, None, f"with_constants({bad[0]}=...): {bad[1]}", f"fold {bad[2]}")
        hooks = {}
        for hook, func in self.hooks.items():
            consts = {var: tir.const(folded[var.name][0], folded[var.name][1]) for var in func.params
                      if var.name in folded}
            hooks[hook] = tu.fold_constant_casts(func.specialize(consts)) if consts else func
        out = Variant(self.name, params=[p for p in self.params if p.name not in folded], state=self.state,
                      doc=self.doc, **hooks)
        out.constants = {**self.constants, **{k: v for k, (v, _) in folded.items()}}
        out.defined_at = self.defined_at
        return out

    def without_mask(self) -> "Variant":
        """This variant with its ``logits_mask`` left out (every key visible), named ``<name>_unmasked``: what
        a cascade runs on the levels a causal mask shows whole (runtime/cascade.py)."""
        hooks = {hook: func for hook, func in self.hooks.items() if hook != "logits_mask"}
        out = Variant(f"{self.name}_unmasked", params=self.params, state=self.state, doc=self.doc, **hooks)
        out.constants = dict(self.constants)
        out.defined_at = self.defined_at
        return out

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    @property
    def scalar_params(self) -> tuple[ScalarParam, ...]:
        return tuple(p for p in self.params if isinstance(p, ScalarParam))

    @property
    def tensor_params(self) -> tuple[TensorParam, ...]:
        return tuple(p for p in self.params if isinstance(p, TensorParam))

    def ir_text(self) -> str:
        """Canonical text of everything that defines the variant (the cache key's IR part)."""
        lines = [f"variant {self.name} state={self.state.value}"]
        lines += [f"constant {k}={v!r}" for k, v in sorted(self.constants.items())]
        lines += [f"param {p!r}" for p in self.params]
        for hook, func in self.hooks.items():
            lines.append(f"hook {hook}")
            lines.append(func.script())
        return "\n".join(lines)

    @cached_property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.ir_text().encode()).hexdigest()[:16]

    @cached_property
    def analysis(self) -> VariantAnalysis:
        return analyze_variant(self)

    def __repr__(self) -> str:
        return f"Variant({self.name!r}, hooks={list(self.hooks)}, state={self.state.value})"


def _init_signature() -> inspect.Signature:
    """``Variant(name, *, params, state, doc, <one keyword per hook kind>)`` for help() and editors."""
    sig = inspect.signature(Variant.__init__)
    fixed = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    hooks = [inspect.Parameter(h, inspect.Parameter.KEYWORD_ONLY, default=None, annotation="tir.PrimFunc | None")
             for h in HOOK_ORDER]
    return sig.replace(parameters=fixed + hooks)


Variant.__init__.__signature__ = _init_signature()
