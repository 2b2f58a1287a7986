"""Causal attention: a query sees keys at or before its own position."""
from tvm.script import tirx as T

from attngen.ir import Variant


@T.prim_func
def causal_mask(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                kv_head: T.int32) -> T.bool:
    return kv_pos <= qo_pos


def make() -> Variant:
    return Variant("causal", logits_mask=causal_mask, doc="softmax attention with a causal mask")
