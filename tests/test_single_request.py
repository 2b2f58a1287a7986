"""single_prefill / single_decode (runtime/single.py): one request without a batch, as FlashInfer's
single_prefill_with_kv_cache / single_decode_with_kv_cache, against the float64 reference on the CPU backend."""
import numpy as np
import pytest

from attngen.runtime import AttentionArgumentError, CPUAttention, reference_attention, single_decode, single_prefill
from attngen.variants import builtin

D = 32


@pytest.fixture(scope="module")
def softcap(build_cache):
    return CPUAttention.build(builtin("logits_softcap"), head_dims=(D,), layouts=("NHD",), cache=build_cache)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_single_prefill_and_decode_match_the_reference(softcap, lib, rng):
    qo_len, kv_len, hq, hkv = 5, 13, 4, 2
    q = rng.standard_normal((qo_len, hq, D)).astype(np.float32)
    k, v = rng.standard_normal((2, kv_len, hkv, D)).astype(np.float32)
    params = {"soft_cap": 7.0}
    ref_o, ref_l = reference_attention(softcap.variant, q, [k], [v], np.array([0, qo_len]), 0.2, params)
    dec_o, dec_l = reference_attention(softcap.variant, q[-1:], [k], [v], np.array([0, 1]), 0.2, params)
    if lib == "torch":
        import torch

        q, k, v = torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v)
    out, lse = single_prefill(softcap, q, k, v, sm_scale=0.2, params=params, return_lse=True)
    assert tuple(out.shape) == (qo_len, hq, D) and tuple(lse.shape) == (qo_len, hq)
    assert np.abs(np.asarray(out) - ref_o).max() < 1e-5 and np.abs(np.asarray(lse) - ref_l).max() < 1e-4
    out = single_decode(softcap, q[-1], k, v, sm_scale=0.2, params=params)
    assert tuple(out.shape) == (hq, D) and np.abs(np.asarray(out) - dec_o[0]).max() < 1e-5
    o, l = single_decode(softcap, q[-1], k, v, sm_scale=0.2, params=params, return_lse=True)
    assert tuple(l.shape) == (hq,) and np.abs(np.asarray(l) - dec_l[0]).max() < 1e-4


def test_single_calls_name_a_bad_argument(softcap, rng):
    k = np.zeros((3, 2, D), np.float32)
    with pytest.raises(AttentionArgumentError, match=r"q: expected \[len, heads, head_dim\]"):
        single_prefill(softcap, np.zeros((4, D), np.float32), k, k)
    with pytest.raises(AttentionArgumentError, match=r"q: expected \[num_qo_heads, head_dim\]"):
        single_decode(softcap, np.zeros((1, 4, D), np.float32), k, k)
    with pytest.raises(AttentionArgumentError, match="kv.k/kv.v: shapes"):
        single_prefill(softcap, np.zeros((1, 4, D), np.float32), k, np.zeros((4, 2, D), np.float32))
