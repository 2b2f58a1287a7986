"""Kernel factory: batch attention as a TIR program for the CPU (LLVM) backend.

``attention_program(...)`` returns a PrimFunc over ragged queries and ragged or
paged KV, with placeholder calls ``attngen_hook_<name>`` where the variant's hooks
go; :mod:`.inline_hooks` replaces them with the hooks' bodies. One query row per
parallel iteration, an online softmax in float32, base-2 LSE, GQA by integer
division of the query head. Positions are logical: query row i of a request with
qo_len rows and kv_len keys sits at qo_pos = kv_len - qo_len + i.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.script import tirx as T

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class CPUKernelSpec:
    """What one CPU attention function is specialised for."""

    kv: str  # "ragged" | "paged"
    decode: bool  # one query per request, q[B, Hq, D] (paged only)
    head_dim: int
    dtype: str  # q/k/v/o element type: "float32" | "float16"
    layout: str = "NHD"  # paged layout: "NHD" pages[P, 2, S, Hkv, D] | "HND" pages[P, 2, Hkv, S, D]
    has_query_transform: bool = False
    has_key_transform: bool = False
    has_logits_transform: bool = False
    has_mask: bool = False
    has_output_transform: bool = False
    softmax: bool = True  # False: unnormalised sum state
    q_scale_log2e: bool = True  # fold log2(e) into the query scale (no logits transform)

    @property
    def func_name(self) -> str:
        if self.decode:
            return f"batch_decode_paged_{self.layout.lower()}"
        return f"batch_prefill_{self.kv}" + (f"_{self.layout.lower()}" if self.kv == "paged" else "")


def attention_program(spec: CPUKernelSpec) -> tvm.tirx.PrimFunc:
    D = spec.head_dim
    dt = spec.dtype
    paged = spec.kv == "paged"
    hnd = spec.layout == "HND"
    decode = spec.decode
    has_qt, has_kt = spec.has_query_transform, spec.has_key_transform
    has_lt, has_mask, has_ot = spec.has_logits_transform, spec.has_mask, spec.has_output_transform
    softmax = spec.softmax
    log2e_q = spec.q_scale_log2e
    log2e_s = softmax and not spec.q_scale_log2e
    neg_inf = tvm.tirx.const(float("-inf"), "float32")
    if decode and not paged:
        raise ValueError("decode kernels read a paged KV cache")

    # fmt: off
    @T.prim_func
    def attention(q_ptr: T.handle,  # [total_q, Hq, D] (decode: [B, Hq, D])
                  kv_a_ptr: T.handle,  # ragged: k[total_kv, Hkv, D]; paged: pages[P, 2, S, Hkv, D] / [P, 2, Hkv, S, D]
                  kv_b_ptr: T.handle,  # ragged: v[total_kv, Hkv, D]; paged: page_indices[nnz]
                  kv_indptr_ptr: T.handle,  # ragged: kv_indptr[B+1]; paged: page_indptr[B+1]
                  last_page_len_ptr: T.handle,  # paged: last_page_len[B]; ragged: unused [B]
                  qo_indptr_ptr: T.handle,  # [B+1] (decode: unused)
                  o_ptr: T.handle,  # like q
                  lse_ptr: T.handle,  # [total_q, Hq] float32, base 2
                  sm_scale: T.float32):
        total_q = T.int32()
        n_qo_heads = T.int32()
        n_kv_heads = T.int32()
        batch_plus_1 = T.int32()
        n_rows_a = T.int32()
        n_rows_b = T.int32()
        page_size = T.int32()
        n_qo_idx = T.int32()
        Q = T.match_buffer(q_ptr, (total_q, n_qo_heads, D), dt)
        O = T.match_buffer(o_ptr, (total_q, n_qo_heads, D), dt)
        LSE = T.match_buffer(lse_ptr, (total_q, n_qo_heads), "float32")
        KV_INDPTR = T.match_buffer(kv_indptr_ptr, (batch_plus_1,), "int32")
        LAST_PAGE_LEN = T.match_buffer(last_page_len_ptr, (batch_plus_1 - 1,), "int32")
        QO_INDPTR = T.match_buffer(qo_indptr_ptr, (n_qo_idx,), "int32")
        if paged:
            if hnd:
                PAGES = T.match_buffer(kv_a_ptr, (n_rows_a, 2, n_kv_heads, page_size, D), dt)
            else:
                PAGES = T.match_buffer(kv_a_ptr, (n_rows_a, 2, page_size, n_kv_heads, D), dt)
            PAGE_IDX = T.match_buffer(kv_b_ptr, (n_rows_b,), "int32")
        else:
            K = T.match_buffer(kv_a_ptr, (n_rows_a, n_kv_heads, D), dt)
            V = T.match_buffer(kv_b_ptr, (n_rows_a, n_kv_heads, D), dt)
        group: T.let = n_qo_heads // n_kv_heads
        if has_kt:
            if paged:
                KT = T.alloc_buffer((n_rows_b * page_size, n_kv_heads, D), "float32")
            else:
                KT = T.alloc_buffer((n_rows_a, n_kv_heads, D), "float32")
        for b in range(batch_plus_1 - 1):
            if paged:
                n_pages: T.let = KV_INDPTR[b + 1] - KV_INDPTR[b]
                kv_len: T.let = T.if_then_else(n_pages > 0, (n_pages - 1) * page_size + LAST_PAGE_LEN[b], 0)
                k_base: T.let = KV_INDPTR[b] * page_size
            else:
                kv_len: T.let = KV_INDPTR[b + 1] - KV_INDPTR[b]
                k_base: T.let = KV_INDPTR[b]
            if decode:
                qo_start: T.let = b
                qo_len: T.let = 1
            else:
                qo_start: T.let = QO_INDPTR[b]
                qo_len: T.let = QO_INDPTR[b + 1] - QO_INDPTR[b]
            if has_kt:
                for jh in T.parallel(kv_len * n_kv_heads):
                    k_in = T.alloc_buffer((D,), "float32", scope="local")
                    k_out = T.alloc_buffer((D,), "float32", scope="local")
                    j: T.let = jh // n_kv_heads
                    hk: T.let = jh % n_kv_heads
                    for d in range(D):
                        if paged:
                            if hnd:
                                k_in[d] = T.Cast("float32", PAGES[PAGE_IDX[KV_INDPTR[b] + j // page_size], 0, hk, j % page_size, d])
                            else:
                                k_in[d] = T.Cast("float32", PAGES[PAGE_IDX[KV_INDPTR[b] + j // page_size], 0, j % page_size, hk, d])
                        else:
                            k_in[d] = T.Cast("float32", K[k_base + j, hk, d])
                    T.evaluate(T.call_extern("int32", "attngen_hook_key_transform", j, hk))
                    for d in range(D):
                        KT[k_base + j, hk, d] = k_out[d]
            for ih in T.parallel(qo_len * n_qo_heads):
                q_in = T.alloc_buffer((D,), "float32", scope="local")
                q_out = T.alloc_buffer((D,), "float32", scope="local")
                acc = T.alloc_buffer((D,), "float32", scope="local")
                o_in = T.alloc_buffer((D,), "float32", scope="local")
                o_out = T.alloc_buffer((D,), "float32", scope="local")
                i: T.let = ih // n_qo_heads
                h: T.let = ih % n_qo_heads
                hk: T.let = h // group
                qo_pos: T.let = kv_len - qo_len + i
                for d in range(D):
                    q_in[d] = T.Cast("float32", Q[qo_start + i, h, d])
                if has_qt:
                    T.evaluate(T.call_extern("int32", "attngen_hook_query_transform", qo_pos, h))
                else:
                    for d in range(D):
                        q_out[d] = q_in[d]
                for d in range(D):
                    if log2e_q:
                        q_out[d] = q_out[d] * (sm_scale * T.float32(LOG2E))
                    else:
                        q_out[d] = q_out[d] * sm_scale
                    acc[d] = T.float32(0)
                m: T.float32 = neg_inf
                denom: T.float32 = T.float32(0)
                for j in range(kv_len):
                    visible: T.let = T.call_extern("bool", "attngen_hook_logits_mask", b, qo_pos, j, h, hk) if has_mask else True
                    if visible:
                        s: T.float32 = T.float32(0)
                        for d in range(D):
                            if has_kt:
                                s = s + q_out[d] * KT[k_base + j, hk, d]
                            elif paged:
                                if hnd:
                                    s = s + q_out[d] * T.Cast("float32", PAGES[PAGE_IDX[KV_INDPTR[b] + j // page_size], 0, hk, j % page_size, d])
                                else:
                                    s = s + q_out[d] * T.Cast("float32", PAGES[PAGE_IDX[KV_INDPTR[b] + j // page_size], 0, j % page_size, hk, d])
                            else:
                                s = s + q_out[d] * T.Cast("float32", K[k_base + j, hk, d])
                        if has_lt:
                            s = T.call_extern("float32", "attngen_hook_logits_transform", s, b, qo_pos, j, h, hk)
                        if log2e_s:
                            s = s * T.float32(LOG2E)
                        if softmax:
                            m_new: T.let = T.max(m, s)
                            live: T.let = m_new > neg_inf  # a -inf score must not turn into NaN
                            rescale: T.let = T.if_then_else(live, T.exp2(m - m_new), T.float32(1))
                            w: T.let = T.if_then_else(live, T.exp2(s - m_new), T.float32(0))
                            denom = denom * rescale + w
                            m = m_new
                        else:
                            rescale: T.let = T.float32(1)
                            w: T.let = s
                        for d in range(D):
                            if paged:
                                if hnd:
                                    acc[d] = acc[d] * rescale + w * T.Cast("float32", PAGES[PAGE_IDX[KV_INDPTR[b] + j // page_size], 1, hk, j % page_size, d])
                                else:
                                    acc[d] = acc[d] * rescale + w * T.Cast("float32", PAGES[PAGE_IDX[KV_INDPTR[b] + j // page_size], 1, j % page_size, hk, d])
                            else:
                                acc[d] = acc[d] * rescale + w * T.Cast("float32", V[k_base + j, hk, d])
                row_lse: T.let = T.if_then_else(denom > T.float32(0), m + T.log2(denom), neg_inf) if softmax else T.float32(0)
                for d in range(D):
                    if softmax:
                        o_in[d] = T.if_then_else(denom > T.float32(0), acc[d] / denom, T.float32(0))
                    else:
                        o_in[d] = acc[d]
                if has_ot:
                    T.evaluate(T.call_extern("int32", "attngen_hook_output_transform", b, qo_pos, h, row_lse))
                else:
                    for d in range(D):
                        o_out[d] = o_in[d]
                for d in range(D):
                    O[qo_start + i, h, d] = T.Cast(dt, o_out[d])
                LSE[qo_start + i, h] = row_lse
    # fmt: on
    return attention.with_attr("global_symbol", spec.func_name)
