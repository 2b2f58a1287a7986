"""attngen: an attention-kernel compiler for variants written as TVM TensorIR hooks.

The public names load on first use (module ``__getattr__``): ``import attngen`` stays cheap for the
command line and for processes that only load built libraries, and ``Variant`` brings TVM in when a
variant is defined.
"""
from __future__ import annotations

__version__ = "0.1.0"

# names re-exported from attngen.ir, resolved there on first use
_IR_NAMES = ("ConfigError", "MaskKind", "ScalarParam", "StateAlgebra", "TensorParam", "Variant", "VariantError")

__all__ = [*_IR_NAMES, "__version__"]


def __getattr__(name: str):
    if name not in _IR_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import ir

    value = getattr(ir, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
