"""Mistral-style attention composed from built-in hooks: RoPE on q and k plus a causal sliding window."""
from attngen import ScalarParam, Variant
from attngen.variants.rope import rope_key, rope_query
from attngen.variants.sliding_window import causal_window_mask

variant = Variant(
    "rope_sliding_window",
    query_transform=rope_query,
    key_transform=rope_key,
    logits_mask=causal_window_mask,
    params=[ScalarParam("rope_scale", "float32", 1.0), ScalarParam("rope_theta", "float32", 1e6),
            ScalarParam("window_left", "int32", 4096)],
)


def main(head_dim: int = 64, **kwargs):
    from attngen.testing import run_cpu_example

    return run_cpu_example(variant, head_dim=head_dim, **kwargs)


if __name__ == "__main__":
    main()
