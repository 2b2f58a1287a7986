"""Llama-style RoPE fused as query and key transforms (rotate-half layout).

angle(pos, i) = pos / rope_scale * rope_theta ** (-2 * (i mod d/2) / d)
"""
from tvm.script import tirx as T

from attngen.ir import ScalarParam, Variant


@T.prim_func
def rope_query(q: T.handle, q_out: T.handle, qo_pos: T.int32, qo_head: T.int32,
               rope_scale: T.float32, rope_theta: T.float32):
    d = T.int32()
    x = T.match_buffer(q, (d,), "float32")
    y = T.match_buffer(q_out, (d,), "float32")
    for i in range(d):
        angle: T.let = T.float32(qo_pos) / rope_scale * T.pow(
            rope_theta, T.float32(-2 * (i % (d // 2))) / T.float32(d))
        y[i] = T.if_then_else(i < d // 2,
                              x[i] * T.cos(angle) - x[i + d // 2] * T.sin(angle),
                              x[i] * T.cos(angle) + x[i - d // 2] * T.sin(angle))


@T.prim_func
def rope_key(k: T.handle, k_out: T.handle, kv_pos: T.int32, kv_head: T.int32,
             rope_scale: T.float32, rope_theta: T.float32):
    d = T.int32()
    x = T.match_buffer(k, (d,), "float32")
    y = T.match_buffer(k_out, (d,), "float32")
    for i in range(d):
        angle: T.let = T.float32(kv_pos) / rope_scale * T.pow(
            rope_theta, T.float32(-2 * (i % (d // 2))) / T.float32(d))
        y[i] = T.if_then_else(i < d // 2,
                              x[i] * T.cos(angle) - x[i + d // 2] * T.sin(angle),
                              x[i] * T.cos(angle) + x[i - d // 2] * T.sin(angle))


def make() -> Variant:
    return Variant(
        "rope",
        query_transform=rope_query,
        key_transform=rope_key,
        params=[ScalarParam("rope_scale", "float32", 1.0), ScalarParam("rope_theta", "float32", 1e4)],
        doc="softmax attention with RoPE applied to q and k on the fly",
    )
