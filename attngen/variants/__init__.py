"""Built-in variants, each a few lines of TIR; ``builtin(name)`` returns a fresh Variant.

A built-in's module (its TIR parsed by TVMScript when imported) is imported at its first ``builtin`` call, so
that loading one variant, or a user's file, parses no other.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from attngen.ir import Variant


def _factory(module: str, **kwargs) -> Callable[[], Variant]:
    """``attngen.variants.<module>.make(**kwargs)``, the module imported when first called."""
    def make() -> Variant:
        return importlib.import_module(f"{__name__}.{module}").make(**kwargs)

    make.__name__ = f"make_{module}"
    return make


BUILTINS: dict[str, Callable[[], Variant]] = {
    "vanilla": _factory("vanilla"),
    "causal": _factory("causal"),
    "sliding_window": _factory("sliding_window", causal=False),
    "sliding_window_causal": _factory("sliding_window", causal=True),
    "logits_softcap": _factory("logits_softcap"),
    "alibi": _factory("alibi"),
    "custom_mask": _factory("custom_mask"),
    "rope": _factory("rope"),
    "attention_sink": _factory("attention_sink"),
    "sigmoid": _factory("sigmoid"),
}


def builtin(name: str) -> Variant:
    if name not in BUILTINS:
        raise KeyError(f"no built-in variant {name!r}; built-ins are {sorted(BUILTINS)}")
    return BUILTINS[name]()
