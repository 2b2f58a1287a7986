"""Sigmoid attention (a 'sum' state: no softmax normaliser), with a causal mask."""
from attngen import ScalarParam, Variant
from attngen.variants.causal import causal_mask
from attngen.variants.sigmoid import sigmoid_weight

variant = Variant("sigmoid_causal", logits_transform=sigmoid_weight, logits_mask=causal_mask, state="sum",
                  params=[ScalarParam("sigmoid_bias", "float32", -2.0)])


def main(head_dim: int = 64, **kwargs):
    from attngen.testing import run_cpu_example

    return run_cpu_example(variant, head_dim=head_dim, **kwargs)


if __name__ == "__main__":
    main()
