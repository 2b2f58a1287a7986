"""Prefix-LM attention (T5 / PaLI style): every query sees the request's whole prefix, then causal
attention after it; the prefix length is per request, a tensor parameter."""
import numpy as np
from tvm.script import tirx as T

from attngen import TensorParam, Variant


@T.prim_func
def prefix_lm_mask(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                   prefix_ptr: T.handle) -> T.bool:
    nbatch = T.int32()
    prefix_len = T.match_buffer(prefix_ptr, (nbatch,), "int32")
    return kv_pos < prefix_len[batch] or kv_pos <= qo_pos


variant = Variant(
    "prefix_lm",
    logits_mask=prefix_lm_mask,
    params=[TensorParam("prefix_len", "int32", ("batch_size",), "keys every query of the request sees")],
    doc="bidirectional over a per-request prefix, causal after it",
)


def prefix_lengths(variant, rng, problem) -> dict:
    """A prefix of up to the request's whole length, per request."""
    return {"prefix_len": np.array([rng.integers(0, n + 1) for n in problem.kv_lens], np.int32)}


def main(head_dim: int = 64, **kwargs):
    from attngen.testing import run_cpu_example

    return run_cpu_example(variant, head_dim=head_dim, make_params=prefix_lengths, **kwargs)


if __name__ == "__main__":
    main()
