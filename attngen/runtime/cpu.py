"""PyTorch/NumPy API over a CPU-backend library: batch prefill (ragged or paged KV) and decode.

Each call checks its arguments, allocates or checks the outputs and calls the
TVM-FFI function for its (kind, layout, dtype, head_dim) from the built library, in the
calling convention of ``codegen/cpu/attention_tir.py`` (``CPU_SIGNATURES``).
Outputs: O like q, and the base-2 LSE per (token, head), float32.
"""
from __future__ import annotations

import numpy as np

from attngen import build as build_entry
from attngen.schedules.build_config import BuildConfig

from .checks import (AttentionArgumentError, check_indptr, check_paged, check_qkv_heads, check_ragged,
                     check_tensor, dtype_name)
from .module import BuiltModule, empty_like, resolve_sm_scale
from .params import resolve_params
from .views import PagedKV, RaggedKV


def _nonempty(x):
    """A 1-row stand-in for a zero-row tensor: DLPack gives zero-size arrays strides that TVM's
    argument checks reject, and the kernels never touch rows of an empty batch."""
    if int(np.prod(x.shape)) != 0:
        return x
    shape = (1,) + tuple(int(n) for n in x.shape[1:])
    return empty_like(x, shape, dtype_name(x))


class CPUAttention(BuiltModule):
    """Attention of one variant on the CPU, from a library built by ``attngen.build``."""

    @classmethod
    def build(cls, variant, head_dims=(128,), dtypes=("float32",), layouts=("NHD", "HND"), **kwargs):
        """Build (or take from the cache) ``variant``'s CPU library; ``kwargs`` go to ``attngen.build.build``."""
        config = BuildConfig("cpu", tuple(head_dims), tuple(dtypes), layouts=tuple(layouts))
        res = build_entry.build(variant, config, **kwargs)
        return cls(variant, res.library, res.manifest)

    def prefill(self, q, kv: PagedKV | RaggedKV, qo_indptr, *, sm_scale: float | None = None,
                params: dict | None = None, out=None, lse=None):
        """q: [total_q, Hq, D]; qo_indptr: [B+1] int32. Returns (out [total_q, Hq, D], lse [total_q, Hq])."""
        check_tensor(q, "q", 3)
        dt, d = dtype_name(q), int(q.shape[2])
        qo = check_indptr(qo_indptr, "qo_indptr", int(q.shape[0]))
        batch = len(qo) - 1
        if isinstance(kv, PagedKV):
            check_paged(kv, d, dt, batch)
            fn = self.function(f"batch_prefill_paged_{kv.layout.lower()}", dt, d)
            kv_args = (_nonempty(kv.pages), kv.indptr, _nonempty(kv.indices), kv.last_page_len)
        elif isinstance(kv, RaggedKV):
            check_ragged(kv, d, dt, batch)
            fn = self.function("batch_prefill_ragged", dt, d)
            kv_args = (_nonempty(kv.k), _nonempty(kv.v), kv.indptr)
        else:
            raise AttentionArgumentError(f"kv: expected PagedKV or RaggedKV, got {type(kv).__name__}")
        check_qkv_heads(q, kv.num_kv_heads, d)
        out, lse = self.outputs(q, int(q.shape[0]), out, lse)
        extras = resolve_params(self.variant, params, num_qo_heads=int(q.shape[1]), batch_size=batch,
                                num_kv_heads=kv.num_kv_heads, head_dim=d, total_q=int(q.shape[0]))
        scale = resolve_sm_scale(sm_scale, d)
        if batch == 0:  # nothing to attend; zero-size index arrays cannot cross the FFI boundary
            return out, lse
        fn(_nonempty(q), qo_indptr, *kv_args, _nonempty(out), _nonempty(lse), scale, *extras)
        return out, lse

    def decode(self, q, kv: PagedKV, *, sm_scale: float | None = None, params: dict | None = None,
               out=None, lse=None):
        """q: [B, Hq, D], one query per request. Returns (out [B, Hq, D], lse [B, Hq])."""
        check_tensor(q, "q", 3)
        if not isinstance(kv, PagedKV):
            raise AttentionArgumentError("kv: decode reads a PagedKV cache")
        dt, d, batch = dtype_name(q), int(q.shape[2]), int(q.shape[0])
        check_paged(kv, d, dt, batch)
        check_qkv_heads(q, kv.num_kv_heads, d)
        fn = self.function(f"batch_decode_paged_{kv.layout.lower()}", dt, d)
        out, lse = self.outputs(q, batch, out, lse)
        extras = resolve_params(self.variant, params, num_qo_heads=int(q.shape[1]), batch_size=batch,
                                num_kv_heads=kv.num_kv_heads, head_dim=d, total_q=batch)
        scale = resolve_sm_scale(sm_scale, d)
        if batch == 0:
            return out, lse
        fn(q, _nonempty(kv.pages), kv.indptr, _nonempty(kv.indices), kv.last_page_len, out, lse, scale, *extras)
        return out, lse
