"""attngen.ir: the Variant (TIR hooks, extra params, state algebra) and its checks and analyses.

The names below load their module on first use (module ``__getattr__``), so that ``attngen.ir.ConfigError``
and the hook table can be imported by the command line and the build configuration without importing TVM,
which only the hooks, their checks and analyses need.
"""
from __future__ import annotations

import importlib
import importlib.util

# public name -> the submodule that defines it
_EXPORTS = {
    "HookReads": "analysis", "ScaleFold": "analysis", "VariantAnalysis": "analysis",
    "Param": "declarations", "ScalarParam": "declarations", "StateAlgebra": "declarations",
    "TensorParam": "declarations",
    "ConfigError": "errors", "VariantError": "errors",
    "HOOK_ORDER": "hook_spec", "HOOKS": "hook_spec", "HookSpec": "hook_spec", "Site": "hook_spec",
    "MaskInfo": "mask_class", "MaskKind": "mask_class", "classify_mask": "mask_class",
    "Variant": "variant",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        if importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")  # a submodule, as the eager package offered
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
