"""Gemma-2-style attention: soft-capped logits under a causal mask, defined from scratch.

    attngen build examples/logits_softcap.py --target cpu --head-dim 64
    python examples/logits_softcap.py
"""
from tvm.script import tirx as T

from attngen import ScalarParam, Variant


@T.prim_func
def softcap(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
            kv_head: T.int32, soft_cap: T.float32) -> T.float32:
    return soft_cap * T.tanh(s / soft_cap)


@T.prim_func
def causal(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return kv_pos <= qo_pos


variant = Variant("softcap_causal", logits_transform=softcap, logits_mask=causal,
                  params=[ScalarParam("soft_cap", "float32", 50.0)])


def main(head_dim: int = 64, **kwargs):
    from attngen.testing import run_cpu_example

    return run_cpu_example(variant, head_dim=head_dim, **kwargs)


if __name__ == "__main__":
    main()
