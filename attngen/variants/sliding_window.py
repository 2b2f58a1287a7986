"""Sliding-window attention: a query sees the `window_left` keys before it (and, if causal, none after)."""
from tvm.script import tirx as T

from attngen.ir import ScalarParam, Variant


@T.prim_func
def window_mask(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                kv_head: T.int32, window_left: T.int32) -> T.bool:
    return qo_pos - kv_pos <= window_left


@T.prim_func
def causal_window_mask(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                       kv_head: T.int32, window_left: T.int32) -> T.bool:
    return kv_pos <= qo_pos and qo_pos - kv_pos <= window_left  # (the difference: no window value wraps it)


def make(causal: bool = True) -> Variant:
    return Variant(
        "sliding_window_causal" if causal else "sliding_window",
        logits_mask=causal_window_mask if causal else window_mask,
        params=[ScalarParam("window_left", "int32", doc="keys visible before the query position")],
        doc="left sliding window" + (" with a causal mask" if causal else ""),
    )
