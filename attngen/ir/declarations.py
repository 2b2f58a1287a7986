"""What a variant declares besides its hooks: its extra parameters and its state algebra.

These are the vocabulary the checks (:mod:`.validate`), the analyses (:mod:`.analysis`)
and the :class:`~attngen.ir.variant.Variant` itself share; they depend on nothing else.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


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
