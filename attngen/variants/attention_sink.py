"""Attention sink: a per-head sink logit joins the softmax denominator but carries no value.

o' = o * 2^lse / (2^lse + e^sink) = o / (1 + 2^(sink * log2(e) - lse)); lse stays the keys' own.
"""
from tvm.script import tirx as T

from attngen.ir import TensorParam, Variant


@T.prim_func
def sink_rescale(o: T.handle, o_out: T.handle, batch: T.int32, qo_pos: T.int32, qo_head: T.int32,
                 lse: T.float32, sink_ptr: T.handle):
    d = T.int32()
    n = T.int32()
    x = T.match_buffer(o, (d,), "float32")
    y = T.match_buffer(o_out, (d,), "float32")
    sink = T.match_buffer(sink_ptr, (n,), "float32")
    for i in range(d):
        y[i] = x[i] / (T.float32(1) + T.exp2(sink[qo_head] * T.float32(1.4426950408889634) - lse))


def make() -> Variant:
    return Variant("attention_sink", output_transform=sink_rescale,
                   params=[TensorParam("sink", "float32", ("num_qo_heads",), "sink logit per query head")],
                   doc="softmax attention with a per-head sink logit")
