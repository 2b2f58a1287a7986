"""Logits soft-capping (Gemma 2, Grok): s -> soft_cap * tanh(s / soft_cap)."""
from tvm.script import tirx as T

from attngen.ir import ScalarParam, Variant


@T.prim_func
def softcap(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
            kv_head: T.int32, soft_cap: T.float32) -> T.float32:
    return soft_cap * T.tanh(s / soft_cap)


def make() -> Variant:
    return Variant("logits_softcap", logits_transform=softcap,
                   params=[ScalarParam("soft_cap", "float32", 30.0)],
                   doc="soft-capped logits")
