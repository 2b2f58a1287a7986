"""Sigmoid attention: o = sum_j sigmoid(s_j + sigmoid_bias) v_j, no normaliser (a 'sum' state)."""
from tvm.script import tirx as T

from attngen.ir import ScalarParam, Variant


@T.prim_func
def sigmoid_weight(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                   kv_head: T.int32, sigmoid_bias: T.float32) -> T.float32:
    return T.float32(1) / (T.float32(1) + T.exp(-(s + sigmoid_bias)))


def make() -> Variant:
    return Variant("sigmoid", logits_transform=sigmoid_weight, state="sum",
                   params=[ScalarParam("sigmoid_bias", "float32", 0.0)],
                   doc="sigmoid attention; sm_scale is the logit scale")
