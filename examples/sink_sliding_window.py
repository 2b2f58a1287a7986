"""GPT-OSS-style attention: a learned per-head sink logit with a causal sliding window.

The sink is applied by the output transform from the row's base-2 LSE, so it also
works when the keys are split across partial states that are merged first.
"""
from attngen import ScalarParam, TensorParam, Variant
from attngen.variants.attention_sink import sink_rescale
from attngen.variants.sliding_window import causal_window_mask

variant = Variant("sink_sliding_window", logits_mask=causal_window_mask, output_transform=sink_rescale,
                  params=[ScalarParam("window_left", "int32", 128),
                          TensorParam("sink", "float32", ("num_qo_heads",))])


def main(head_dim: int = 64, **kwargs):
    from attngen.testing import run_cpu_example

    return run_cpu_example(variant, head_dim=head_dim, **kwargs)


if __name__ == "__main__":
    main()
