"""One request without a batch: FlashInfer's ``single_prefill_with_kv_cache`` / ``single_decode_with_kv_cache``
on any attngen library (CPU or CUDA backend).

Keys and values are taken as they are ([kv_len, Hkv, D], views of a fused projection included: no copy into a
page pool), as a one-request ragged batch; a single decode is that batch with one query row (the ragged
prefill serves it: the decode templates read paged caches).
"""
from __future__ import annotations

import numpy as np

from .checks import AttentionArgumentError
from .module import int32_like, scale_kwargs
from .views import RaggedKV


def single_prefill(att, q, k, v, *, sm_scale: float | None = None, params: dict | None = None,
                   return_lse: bool = False, k_scale=None, v_scale=None):
    """q [qo_len, Hq, D], k / v [kv_len, Hkv, D] of one request (query row i at position kv_len - qo_len + i)
    through ``att`` (a CPUAttention or CUDAAttention). Returns out [qo_len, Hq, D], with lse [qo_len, Hq] (base
    2) when ``return_lse``."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if len(getattr(x, "shape", ())) != 3:
            raise AttentionArgumentError(f"{name}: expected [len, heads, head_dim], got shape "
                                         f"{tuple(getattr(x, 'shape', ()))}")
    ref = q if hasattr(q, "detach") else k  # (the index arrays where the backend looks for them: q's device)
    for name, x in (("k", k), ("v", v)):
        if hasattr(ref, "detach") and hasattr(x, "device") and str(x.device) != str(ref.device):
            raise AttentionArgumentError(f"{name}: on {x.device}, q on {ref.device}; pass all three on one device")
    kv = RaggedKV(k, v, int32_like(ref, np.array([0, int(k.shape[0])])))
    qo_indptr = int32_like(ref, np.array([0, int(q.shape[0])]))
    out, lse = att.prefill(q, kv, qo_indptr, sm_scale=sm_scale, params=params, **scale_kwargs(k_scale, v_scale))
    return (out, lse) if return_lse else out


def single_decode(att, q, k, v, *, sm_scale: float | None = None, params: dict | None = None,
                  return_lse: bool = False, k_scale=None, v_scale=None):
    """q [Hq, D], the request's next token, over k / v [kv_len, Hkv, D] (it sits at position kv_len - 1).
    Returns out [Hq, D], with lse [Hq] when ``return_lse``. (A one-row prefill: its keys are not split over
    CTAs for masked variants, so a long context decodes faster from a paged cache through ``att.decode``.)"""
    if len(getattr(q, "shape", ())) != 2:
        raise AttentionArgumentError(f"q: expected [num_qo_heads, head_dim], got shape "
                                     f"{tuple(getattr(q, 'shape', ()))}")
    res = single_prefill(att, q[None], k, v, sm_scale=sm_scale, params=params, return_lse=return_lse,
                         k_scale=k_scale, v_scale=v_scale)
    return (res[0][0], res[1][0]) if return_lse else res[0]
