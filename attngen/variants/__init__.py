"""Built-in variants, each a few lines of TIR; ``builtin(name)`` returns a fresh Variant."""
from __future__ import annotations

from functools import partial
from typing import Callable

from attngen.ir import Variant

from . import (alibi, attention_sink, causal, custom_mask, logits_softcap, rope, sigmoid,
               sliding_window, vanilla)

BUILTINS: dict[str, Callable[[], Variant]] = {
    "vanilla": vanilla.make,
    "causal": causal.make,
    "sliding_window": partial(sliding_window.make, causal=False),
    "sliding_window_causal": partial(sliding_window.make, causal=True),
    "logits_softcap": logits_softcap.make,
    "alibi": alibi.make,
    "custom_mask": custom_mask.make,
    "rope": rope.make,
    "attention_sink": attention_sink.make,
    "sigmoid": sigmoid.make,
}


def builtin(name: str) -> Variant:
    if name not in BUILTINS:
        raise KeyError(f"no built-in variant {name!r}; built-ins are {sorted(BUILTINS)}")
    return BUILTINS[name]()
