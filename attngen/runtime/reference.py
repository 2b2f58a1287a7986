"""Float64 NumPy reference attention that applies a variant's hooks through the TIR interpreter.

Used by tests and examples as the oracle for every backend. Queries are ragged
(``qo_indptr``), keys are given per request as dense ``[kv_len, H_kv, D]`` arrays
(the callers gather pages themselves, so page-table handling is tested, not
assumed). Query row i of a request sits at position ``kv_len - qo_len + i``.
Quantised keys and values (fp8, see ``fp8.py``) come with their scales and enter as their exact
float64 values times the scale, the values the kernels' hooks see.
"""
from __future__ import annotations

import numpy as np

from attngen.ir import StateAlgebra
from attngen.ir.tir_eval import apply_hook

from .fp8 import dequantize_kv


def reference_attention(variant, q: np.ndarray, keys: list[np.ndarray], values: list[np.ndarray],
                        qo_indptr: np.ndarray, sm_scale: float, params: dict | None = None, *,
                        k_scale=None, v_scale=None):
    """Attention of ``variant`` in float64.

    q: [total_q, Hq, D]; keys[b], values[b]: [kv_len_b, Hkv, D]; qo_indptr: [B+1].
    ``k_scale``, ``v_scale``: the scales of quantised keys / values (a float or [Hkv]); a key's value
    is ``keys[b] * k_scale`` (fp8 arrays or torch tensors are read exactly).
    Returns (o [total_q, Hq, D] float64, lse [total_q, Hq] float64, base 2).
    """
    params = params or {}
    if k_scale is not None or v_scale is not None:
        keys = [dequantize_kv(k, 1.0 if k_scale is None else k_scale) for k in keys]
        values = [dequantize_kv(v, 1.0 if v_scale is None else v_scale) for v in values]
    total_q, n_qo, d = q.shape
    o = np.zeros((total_q, n_qo, d))
    lse = np.zeros((total_q, n_qo))
    for b in range(len(qo_indptr) - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k = keys[b].astype(np.float64)
        v = values[b].astype(np.float64)
        kv_len, n_kv, _ = k.shape
        qo_len = q1 - q0
        if qo_len == 0:
            continue
        group = n_qo // n_kv
        qo_pos = np.arange(qo_len) + kv_len - qo_len  # [qo_len]
        kv_pos = np.arange(kv_len)
        heads = np.arange(n_qo)
        kv_heads = np.arange(n_kv)
        qb = q[q0:q1].astype(np.float64)  # [qo_len, Hq, D]
        # each site's standard arguments, broadcasting over the rows or scores of that site
        query_rows = dict(batch=b, qo_pos=qo_pos[:, None], qo_head=heads[None, :])  # [qo_len, Hq]
        key_rows = dict(batch=b, kv_pos=kv_pos[:, None], kv_head=kv_heads[None, :])  # [kv_len, Hkv]
        qb = apply_hook(variant, "query_transform", query_rows, params, qb)
        if kv_len:
            k = apply_hook(variant, "key_transform", key_rows, params, k)
        # (matmul, not einsum: BLAS products, many times faster for long requests; float64 either way. BLAS
        # fuses multiply-adds: a product past float64's range alone could give Inf where einsum gave NaN, which
        # no 16-bit, fp8 or float32 input reaches)
        with np.errstate(invalid="ignore", over="ignore"):  # (Inf x 0 in a product: NaN, as the rules want)
            s = _grouped_matmul(qb.transpose(1, 0, 2), k.transpose(1, 2, 0)) * sm_scale  # [Hq, qo_len, kv_len]
        H = heads[:, None, None]
        scores = dict(s=s, batch=b, qo_pos=qo_pos[None, :, None], kv_pos=kv_pos[None, None, :], qo_head=H,
                      kv_head=H // group)
        s = np.broadcast_to(apply_hook(variant, "logits_transform", scores, params), s.shape).astype(np.float64)
        visible = np.broadcast_to(apply_hook(variant, "logits_mask", scores, params), s.shape)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if variant.state == StateAlgebra.SUM:
                ob = _weighted_values(np.where(visible, s, 0.0), visible, v)
                lb = np.zeros((qo_len, n_qo))
            else:
                ob, lb = _softmax_rows(s, visible, v)
        ob = apply_hook(variant, "output_transform", dict(query_rows, lse=lb), params, ob)
        o[q0:q1] = ob
        lse[q0:q1] = lb
    return o, lse


def _grouped_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a [Hq, M, K] @ b [Hkv, K, N] -> [Hq, M, N], query head h against KV head h // (Hq / Hkv): each KV head's
    group of query heads in one product, without copies of the KV head for each query head of its group."""
    n_q, m, _ = a.shape
    n_kv = b.shape[0]
    out = np.matmul(a.reshape(n_kv, (n_q // n_kv) * m, a.shape[2]), b)  # [Hkv, group * M, N]
    return out.reshape(n_q, m, b.shape[2])


def _weighted_values(w: np.ndarray, visible: np.ndarray, v: np.ndarray) -> np.ndarray:
    """sum_j w[h, i, j] * v[j, h // group, :] over the visible keys only, [qo_len, Hq, D] (w, visible: [Hq, qo_len,
    kv_len]; v: [kv_len, Hkv, D]): a masked key's value is never read, so a non-finite value there (0 * Inf = NaN)
    cannot reach the row."""
    if np.isfinite(v).all():  # the masked weights are 0 and every product is finite: one batched product
        return _grouped_matmul(w, v.transpose(1, 0, 2)).transpose(1, 0, 2)
    vx = np.repeat(v, w.shape[0] // v.shape[1], axis=1)  # [kv_len, Hq, D]
    terms = w[..., None] * np.transpose(vx, (1, 0, 2))[:, None]  # [Hq, qo_len, kv_len, D]
    return np.where(visible[..., None], terms, 0.0).sum(axis=2).transpose(1, 0, 2)


def _softmax_rows(s: np.ndarray, visible: np.ndarray, v: np.ndarray):
    """Normalised rows and base-2 lse of the softmax state, with attngen's rules for non-finite scores
    (``s``, ``visible``: [Hq, qo_len, kv_len]; ``v``: [kv_len, Hkv, D]; the stable softmax evaluated in IEEE
    arithmetic):

    * a row whose visible scores are all -inf, or that has none, is empty: O = 0, lse = -inf (the
      merge identity; a -inf score acts as a mask);
    * a NaN score poisons its row: O = NaN, lse = NaN;
    * a +inf score gives exp(s - max) = exp(inf - inf) = NaN: O = NaN, lse = NaN as well (telling it apart
      from a NaN score would need a NaN-propagating running max in every kernel's hot loop);
    * a non-finite value of a visible key makes the output columns it enters non-finite (Inf or NaN).
    """
    masked = np.where(visible, s, -np.inf)
    m = masked.max(axis=-1, initial=-np.inf, keepdims=True)  # NaN when a visible score is NaN
    empty = m == -np.inf
    base = np.where(empty, 0.0, m)
    p = np.where(visible, np.exp(masked - base), 0.0)
    denom = p.sum(axis=-1, keepdims=True)
    ob = _weighted_values(p / np.where(empty, 1.0, denom), visible, v)
    lb = np.where(empty, -np.inf, np.log(denom) + base)[..., 0] / np.log(2.0)
    return ob, lb.T  # [qo_len, Hq, D], [qo_len, Hq]


def gather_pages(pages: np.ndarray, indptr, indices, last_page_len, layout: str = "NHD"):
    """Per-request dense (keys, values) from a paged cache; pages [P, 2, S, Hkv, D] (NHD) or [P, 2, Hkv, S, D]."""
    keys, values = [], []
    for b in range(len(indptr) - 1):
        ids = indices[indptr[b]:indptr[b + 1]]
        if len(ids) == 0:
            shape = (0, pages.shape[3] if layout == "NHD" else pages.shape[2], pages.shape[-1])
            keys.append(np.zeros(shape, pages.dtype))
            values.append(np.zeros(shape, pages.dtype))
            continue
        chunk = pages[ids]
        if layout == "HND":
            chunk = chunk.transpose(0, 1, 3, 2, 4)
        n = (len(ids) - 1) * chunk.shape[2] + int(last_page_len[b])
        keys.append(chunk[:, 0].reshape(-1, *chunk.shape[3:])[:n])
        values.append(chunk[:, 1].reshape(-1, *chunk.shape[3:])[:n])
    return keys, values
