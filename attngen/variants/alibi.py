"""ALiBi: a per-head linear bias slope[qo_head] * (kv_pos - qo_pos) added to every logit."""
from tvm.script import tirx as T

from attngen.ir import TensorParam, Variant


@T.prim_func
def alibi_bias(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
               kv_head: T.int32, slopes_ptr: T.handle) -> T.float32:
    n = T.int32()
    alibi_slopes = T.match_buffer(slopes_ptr, (n,), "float32")
    return s + alibi_slopes[qo_head] * T.float32(kv_pos - qo_pos)


def make() -> Variant:
    return Variant("alibi", logits_transform=alibi_bias,
                   params=[TensorParam("alibi_slopes", "float32", ("num_qo_heads",))],
                   doc="ALiBi positional bias")
