"""User variants whose row hooks are not per-element (so templates take their whole-row path)."""
from tvm.script import tirx as T

from attngen import Variant


@T.prim_func
def swap_halves(x_ptr: T.handle, y_ptr: T.handle, kv_pos: T.int32, kv_head: T.int32):
    d = T.int32()
    x = T.match_buffer(x_ptr, (d,), "float32")
    y = T.match_buffer(y_ptr, (d,), "float32")
    for i in range(d // 2):
        y[i] = x[i + d // 2]
    for i in range(d // 2):
        y[i + d // 2] = x[i]


@T.prim_func
def double_then_shift(x_ptr: T.handle, y_ptr: T.handle, batch: T.int32, qo_pos: T.int32, qo_head: T.int32,
                      lse: T.float32):
    d = T.int32()
    x = T.match_buffer(x_ptr, (d,), "float32")
    y = T.match_buffer(y_ptr, (d,), "float32")
    for i in range(d):
        y[i] = x[i] * T.float32(2)
    for i in range(d):
        y[i] = y[i] + T.float32(0.5)


@T.prim_func
def negate_q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
    d = T.int32()
    x = T.match_buffer(x_ptr, (d,), "float32")
    y = T.match_buffer(y_ptr, (d,), "float32")
    for i in range(d):
        y[i] = -x[i]
    for i in range(d):
        y[i] = y[i] * T.float32(1.5)


def make() -> Variant:
    return Variant("whole_row_hooks", query_transform=negate_q, key_transform=swap_halves,
                   output_transform=double_then_shift)
