"""Gemma-2-style attention: logits soft-capping (50 in Gemma 2) and, on alternate layers, a causal
sliding window (4096 keys), composed from built-in hooks into one variant."""
from attngen import ScalarParam, Variant
from attngen.variants.logits_softcap import softcap
from attngen.variants.sliding_window import causal_window_mask

variant = Variant(
    "gemma2_softcap_window",
    logits_transform=softcap,
    logits_mask=causal_window_mask,
    params=[ScalarParam("soft_cap", "float32", 50.0), ScalarParam("window_left", "int32", 4096)],
    doc="soft-capped logits under a causal sliding window (Gemma 2's local layers)",
)


def main(head_dim: int = 64, **kwargs):
    from attngen.testing import run_cpu_example

    return run_cpu_example(variant, head_dim=head_dim, **kwargs)


if __name__ == "__main__":
    main()
