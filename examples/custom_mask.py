"""A per-request boolean mask packed into bits (e.g. tree attention for speculative decoding).

``attngen.runtime.pack_custom_mask`` turns one [qo_len, kv_len] mask per request into
the variant's ``mask_bits`` / ``mask_offset`` / ``mask_stride`` parameters.
"""
import numpy as np

from attngen.runtime import RaggedKV, pack_custom_mask, reference_attention
from attngen.variants import builtin

variant = builtin("custom_mask")


def main(head_dim: int = 64, seed: int = 0, cache=None):
    from attngen.runtime import CPUAttention

    rng = np.random.default_rng(seed)
    qo_lens, kv_lens = [3, 4], [8, 4]
    # request 0: a small token tree over an 5-token prefix; request 1: plain causal
    tree = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)
    masks = [np.concatenate([np.ones((3, 5), bool), tree], axis=1), np.tril(np.ones((4, 4), bool))]
    params = pack_custom_mask(masks, kv_lens)
    qo_indptr = np.array([0, 3, 7], np.int32)
    kv_indptr = np.array([0, 8, 12], np.int32)
    q = rng.standard_normal((7, 4, head_dim)).astype(np.float32)
    k = rng.standard_normal((12, 2, head_dim)).astype(np.float32)
    v = rng.standard_normal((12, 2, head_dim)).astype(np.float32)
    att = CPUAttention.build(variant, head_dims=(head_dim,), **({"cache": cache} if cache else {}))
    out, lse = att.prefill(q, RaggedKV(k, v, kv_indptr), qo_indptr, params=params)
    ref, ref_lse = reference_attention(variant, q, [k[:8], k[8:]], [v[:8], v[8:]], qo_indptr,
                                       1 / np.sqrt(head_dim), params)
    err = float(np.abs(out - ref).max())
    print(f"custom_mask: max|O-ref| {err:.2e}, max|lse-ref| {float(np.abs(lse - ref_lse).max()):.2e}")
    assert err < 1e-5
    return {"prefill_ragged": {"out_err": err}}


if __name__ == "__main__":
    main()
