"""ALiBi (BLOOM/MPT): a per-head linear position bias on the logits, under a causal mask."""
from attngen import TensorParam, Variant
from attngen.variants.alibi import alibi_bias
from attngen.variants.causal import causal_mask

variant = Variant("alibi_causal", logits_transform=alibi_bias, logits_mask=causal_mask,
                  params=[TensorParam("alibi_slopes", "float32", ("num_qo_heads",))])


def main(head_dim: int = 64, **kwargs):
    from attngen.testing import run_cpu_example

    return run_cpu_example(variant, head_dim=head_dim, **kwargs)


if __name__ == "__main__":
    main()
