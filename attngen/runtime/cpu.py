"""PyTorch/NumPy API over a CPU-backend library: batch prefill (ragged or paged KV) and decode.

Each call checks its arguments, allocates or checks the outputs and calls the
TVM-FFI function for its (kind, layout, dtype, head_dim) from the built library, in the
calling convention of ``codegen/cpu/attention_tir.py`` (``CPU_SIGNATURES``).
Outputs: O like q, and the base-2 LSE per (token, head), float32.

An fp8 KV cache (``fp8.py``: torch / ml_dtypes ``float8_e4m3fn`` or ``float8_e5m2``) is read by the
functions built for that K/V dtype (``BuildConfig.kv_dtypes``) and needs ``k_scale`` and
``v_scale``; any other cache is in the query's dtype and takes no scales.
"""
from __future__ import annotations

import numpy as np

from attngen import build as build_entry
from attngen.schedules.build_config import BuildConfig
from attngen.schedules.dtypes import is_fp8

from .checks import (AttentionArgumentError, check_indptr, check_paged, check_qkv_heads, check_ragged,
                     check_tensor, dtype_name)
from .fp8 import kv_bits, kv_scales, scale_args
from .module import BuiltModule, contiguous, empty_like, exportable, resolve_sm_scale
from .params import check_query_positions, resolve_params
from .views import PagedKV, RaggedKV, host_kv_lengths, longest_kv


def _nonempty(x):
    """A 1-row stand-in for a zero-row tensor: DLPack gives zero-size arrays strides that TVM's
    argument checks reject, and the kernels never touch rows of an empty batch."""
    if int(np.prod(x.shape)) != 0:
        return x
    shape = (1,) + tuple(int(n) for n in x.shape[1:])
    return empty_like(x, shape, dtype_name(x))


def _call(fn, *args) -> None:
    """fn(*args), read-only NumPy inputs copied (``exportable``; outputs were refused by name where read-only)."""
    fn(*(exportable(a) for a in args))


def _kernel_kv(x):
    """K/V as the kernels take them: the bits of an fp8 tensor (``fp8.kv_bits``), any other as it is (copied
    contiguous where it is a strided view)."""
    return kv_bits(contiguous(x)) if is_fp8(dtype_name(x)) else contiguous(x)


class CPUAttention(BuiltModule):
    """Attention of one variant on the CPU, from a library built by ``attngen.build``."""

    @classmethod
    def build(cls, variant, head_dims=(128,), dtypes=("float32",), layouts=("NHD", "HND"), kv_dtypes=(),
              **kwargs):
        """Build (or take from the cache) ``variant``'s CPU library; ``kwargs`` go to ``attngen.build.build``.
        ``kv_dtypes``: the K/V dtype of each query dtype (() = the query's; an fp8 format for fp8 caches)."""
        config = BuildConfig("cpu", head_dims, dtypes, layouts=layouts, kv_dtypes=kv_dtypes)  # (it checks their form)
        res = build_entry.build(variant, config, **kwargs)
        return cls(variant, res.library, res.manifest)

    @staticmethod
    def _scale_args(q, kv, kv_dtype: str, k_scale, v_scale) -> tuple:
        """The fp8 functions' (k_scale [Hkv], v_scale [Hkv]) float32; () for a cache in the query dtype."""
        return scale_args(kv_dtype, k_scale, v_scale, lambda scale, name: kv_scales(
            scale, name, kv_dtype=kv_dtype, num_kv_heads=kv.num_kv_heads, like=q))

    def prefill(self, q, kv: PagedKV | RaggedKV, qo_indptr, *, sm_scale: float | None = None,
                params: dict | None = None, out=None, lse=None, k_scale=None, v_scale=None):
        """q: [total_q, Hq, D]; qo_indptr: [B+1] int32. Returns (out [total_q, Hq, D], lse [total_q, Hq]).
        ``k_scale``, ``v_scale``: an fp8 cache's scales (a float or float32 [Hkv], see ``fp8.py``)."""
        check_tensor(q, "q", 3, strided="any")
        dt, d = dtype_name(q), int(q.shape[2])
        qo = check_indptr(qo_indptr, "qo_indptr", int(q.shape[0]), queries=True)
        batch = len(qo) - 1
        if not isinstance(kv, (PagedKV, RaggedKV)):
            raise AttentionArgumentError(f"kv: expected PagedKV or RaggedKV, got {type(kv).__name__}")
        kv_dt = kv.kv_dtype if is_fp8(kv.kv_dtype) else dt
        if isinstance(kv, PagedKV):
            check_paged(kv, d, kv_dt, batch, strided="any")
            kind = f"batch_prefill_paged_{kv.layout.lower()}"
            kv_args = (_nonempty(_kernel_kv(kv.pages)), kv.indptr, _nonempty(kv.indices), kv.last_page_len)
        else:
            check_ragged(kv, d, kv_dt, batch, strided="any")
            kind = "batch_prefill_ragged"
            kv_args = (_nonempty(_kernel_kv(kv.k)), _nonempty(_kernel_kv(kv.v)), kv.indptr)
        check_qkv_heads(q, kv.num_kv_heads, d)
        check_query_positions(self.variant, np.diff(qo), lambda: host_kv_lengths(kv))
        scales = self._scale_args(q, kv, kv_dt, k_scale, v_scale)
        fn = self.function(kind, dt, d, kv_dt)
        out, lse = self.outputs(q, int(q.shape[0]), out, lse)
        extras = resolve_params(self.variant, params, num_qo_heads=int(q.shape[1]), batch_size=batch,
                                num_kv_heads=kv.num_kv_heads, head_dim=d, total_q=int(q.shape[0]),
                                positions=lambda: longest_kv(kv))
        scale = resolve_sm_scale(sm_scale, d)
        if batch == 0:  # nothing to attend; zero-size index arrays cannot cross the FFI boundary
            return out, lse
        _call(fn, _nonempty(contiguous(q)), qo_indptr, *kv_args, _nonempty(out), _nonempty(lse), *scales, scale,
              *extras)
        return out, lse

    def decode(self, q, kv: PagedKV, *, sm_scale: float | None = None, params: dict | None = None,
               out=None, lse=None, k_scale=None, v_scale=None):
        """q: [B, Hq, D], one query per request. Returns (out [B, Hq, D], lse [B, Hq]).
        ``k_scale``, ``v_scale``: an fp8 cache's scales (a float or float32 [Hkv], see ``fp8.py``)."""
        check_tensor(q, "q", 3, strided="any")
        if not isinstance(kv, PagedKV):
            raise AttentionArgumentError("kv: decode reads a PagedKV cache")
        dt, d, batch = dtype_name(q), int(q.shape[2]), int(q.shape[0])
        kv_dt = kv.kv_dtype if is_fp8(kv.kv_dtype) else dt
        check_paged(kv, d, kv_dt, batch, strided="any")
        check_qkv_heads(q, kv.num_kv_heads, d)
        check_query_positions(self.variant, np.ones(batch, np.int64), lambda: host_kv_lengths(kv), decode=True)
        scales = self._scale_args(q, kv, kv_dt, k_scale, v_scale)
        fn = self.function(f"batch_decode_paged_{kv.layout.lower()}", dt, d, kv_dt)
        out, lse = self.outputs(q, batch, out, lse)
        extras = resolve_params(self.variant, params, num_qo_heads=int(q.shape[1]), batch_size=batch,
                                num_kv_heads=kv.num_kv_heads, head_dim=d, total_q=batch,
                                positions=lambda: longest_kv(kv))
        scale = resolve_sm_scale(sm_scale, d)
        if batch == 0:
            return out, lse
        _call(fn, contiguous(q), _nonempty(_kernel_kv(kv.pages)), kv.indptr, _nonempty(kv.indices), kv.last_page_len,
              out, lse, *scales, scale, *extras)
        return out, lse
