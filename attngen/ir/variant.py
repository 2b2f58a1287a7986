"""`Variant`: an attention variant defined by its TIR hooks, extra parameters and state algebra."""
from __future__ import annotations

import enum
import hashlib
import inspect
from dataclasses import dataclass
from functools import cached_property

import tvm.tirx as tir

from .hook_spec import HOOK_ORDER


class StateAlgebra(str, enum.Enum):
    """How partial attention states combine."""

    SOFTMAX = "softmax"  # (O, lse): normalised output plus base-2 log-sum-exp, merged by lse
    SUM = "sum"  # unnormalised weighted sum (e.g. sigmoid attention), merged by addition


@dataclass(frozen=True)
class ScalarParam:
    """A runtime scalar passed to every hook that declares a parameter of this name."""

    name: str
    dtype: str = "float32"
    default: float | int | None = None
    doc: str = ""


@dataclass(frozen=True)
class TensorParam:
    """A runtime tensor (e.g. ALiBi slopes) readable by hooks; ``shape`` names its dims."""

    name: str
    dtype: str
    shape: tuple[str, ...] = ("n",)
    doc: str = ""


Param = ScalarParam | TensorParam


class Variant:
    """An attention variant: name, hooks (TVMScript prim_funcs), extra params, state algebra.

    Hooks left out are the identity (no transform, no mask). Construction runs every
    check of :mod:`attngen.ir.validate` and raises :class:`VariantError` on the first
    problem found.
    """

    def __init__(
        self,
        name: str,
        *,
        query_transform: tir.PrimFunc | None = None,
        key_transform: tir.PrimFunc | None = None,
        logits_transform: tir.PrimFunc | None = None,
        logits_mask: tir.PrimFunc | None = None,
        output_transform: tir.PrimFunc | None = None,
        params: tuple[Param, ...] | list[Param] = (),
        state: StateAlgebra | str = StateAlgebra.SOFTMAX,
        doc: str = "",
    ):
        from .validate import validate_variant

        given = dict(
            query_transform=query_transform,
            key_transform=key_transform,
            logits_transform=logits_transform,
            logits_mask=logits_mask,
            output_transform=output_transform,
        )
        self.name = name
        self.hooks: dict[str, tir.PrimFunc] = {k: given[k] for k in HOOK_ORDER if given[k] is not None}
        self.params: tuple[Param, ...] = tuple(params)
        self.state = state
        self.doc = doc
        caller = inspect.stack()[1]
        self.defined_at = f"{caller.filename}:{caller.lineno}"
        validate_variant(self)
        self.state = StateAlgebra(state)

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
        lines += [f"param {p!r}" for p in self.params]
        for hook, func in self.hooks.items():
            lines.append(f"hook {hook}")
            lines.append(func.script())
        return "\n".join(lines)

    @cached_property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.ir_text().encode()).hexdigest()[:16]

    @cached_property
    def analysis(self):
        from .analysis import analyze_variant

        return analyze_variant(self)

    def __repr__(self) -> str:
        return f"Variant({self.name!r}, hooks={list(self.hooks)}, state={self.state.value})"
