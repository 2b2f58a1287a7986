"""Custom mask from packed bits (bit j of the stream is byte j//8, bit j%8: little bit order).

For request ``batch`` the bit of (qo_pos, kv_pos) is at
``mask_offset[batch] + qo_pos * mask_stride[batch] + kv_pos``; the runtime helper
``attngen.runtime.pack_custom_mask`` builds these arrays from per-request boolean masks.
"""
from tvm.script import tirx as T

from attngen.ir import TensorParam, Variant


@T.prim_func
def packed_mask(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                bits_ptr: T.handle, offset_ptr: T.handle, stride_ptr: T.handle) -> T.bool:
    nbytes = T.int32()
    nbatch = T.int32()
    mask_bits = T.match_buffer(bits_ptr, (nbytes,), "uint8")
    mask_offset = T.match_buffer(offset_ptr, (nbatch,), "int32")
    mask_stride = T.match_buffer(stride_ptr, (nbatch,), "int32")
    idx: T.let = mask_offset[batch] + qo_pos * mask_stride[batch] + kv_pos
    return T.bitwise_and(T.shift_right(T.Cast("int32", mask_bits[T.shift_right(idx, 3)]), T.bitwise_and(idx, 7)), 1) == 1


def make() -> Variant:
    return Variant(
        "custom_mask",
        logits_mask=packed_mask,
        params=[
            TensorParam("mask_bits", "uint8", ("num_mask_bytes",), "packed mask bits, little bit order"),
            TensorParam("mask_offset", "int32", ("batch_size",), "bit index of (qo_pos 0, kv_pos 0)"),
            TensorParam("mask_stride", "int32", ("batch_size",), "bits per query row (= kv_len)"),
        ],
        doc="arbitrary per-request mask from packed bits",
    )
