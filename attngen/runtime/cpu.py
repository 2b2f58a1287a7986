"""PyTorch/NumPy API over a CPU-backend library: batch prefill (ragged or paged KV) and decode.

Each call checks its arguments, allocates or checks the outputs and calls the
TVM-FFI function for its (kind, layout, dtype, head_dim) from the built library.
Outputs: O like q, and the base-2 LSE per (token, head), float32.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import tvm_ffi

from attngen.schedules.build_config import BuildConfig, symbol

from .checks import (AttentionArgumentError, check_indptr, check_paged, check_qkv_heads, check_ragged,
                     check_tensor, dtype_name)
from .params import resolve_params
from .views import PagedKV, RaggedKV


def _empty_like(ref, shape, dtype: str):
    if hasattr(ref, "detach"):
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype))
    return np.empty(shape, dtype=dtype)


def _int32_like(ref, values):
    if hasattr(ref, "detach"):
        import torch

        return torch.as_tensor(np.asarray(values, dtype=np.int32))
    return np.asarray(values, dtype=np.int32)


def _nonempty(x):
    """A 1-row stand-in for a zero-row tensor: DLPack gives zero-size arrays strides that TVM's
    argument checks reject, and the kernels never touch rows of an empty batch."""
    if int(np.prod(x.shape)) != 0:
        return x
    shape = (1,) + tuple(int(n) for n in x.shape[1:])
    return _empty_like(x, shape, dtype_name(x))


class CPUAttention:
    """Attention of one variant on the CPU, from a library built by ``attngen.build``."""

    def __init__(self, variant, library: str | Path, manifest: dict | None = None):
        self.variant = variant
        self.library = Path(library)
        if manifest is None:
            manifest = json.loads((self.library.parent / "manifest.json").read_text())
        if manifest.get("variant") != variant.name:
            raise ValueError(f"{self.library} was built for variant {manifest.get('variant')!r}, "
                             f"not {variant.name!r}")
        self.manifest = manifest
        self.functions = set(manifest["functions"])
        self._mod = tvm_ffi.load_module(str(self.library))

    @classmethod
    def build(cls, variant, head_dims=(128,), dtypes=("float32",), layouts=("NHD", "HND"), **kwargs):
        from attngen.codegen.pipeline import run_pipeline

        res = run_pipeline(variant, BuildConfig("cpu", tuple(head_dims), tuple(dtypes), layouts=tuple(layouts)),
                           **kwargs)
        return cls(variant, res.library, res.manifest)

    def _function(self, kind: str, dtype: str, head_dim: int):
        name = symbol(kind, dtype, head_dim)
        if name not in self.functions:
            raise AttentionArgumentError(
                f"{self.library.name} has no {name}: it was built for {sorted(self.functions)}; rebuild with "
                f"head_dims including {head_dim}, dtypes including {dtype} and the needed layout")
        return self._mod[name]

    def _outputs(self, q, n_rows: int, out, lse):
        n_qo, d = int(q.shape[1]), int(q.shape[2])
        dt = dtype_name(q)
        if out is None:
            out = _empty_like(q, (n_rows, n_qo, d), dt)
        check_tensor(out, "out", 3, dt)
        if tuple(out.shape) != (n_rows, n_qo, d):
            raise AttentionArgumentError(f"out: shape {tuple(out.shape)}, expected {(n_rows, n_qo, d)}")
        if lse is None:
            lse = _empty_like(q, (n_rows, n_qo), "float32")
        check_tensor(lse, "lse", 2, "float32")
        if tuple(lse.shape) != (n_rows, n_qo):
            raise AttentionArgumentError(f"lse: shape {tuple(lse.shape)}, expected {(n_rows, n_qo)}")
        return out, lse

    def prefill(self, q, kv: PagedKV | RaggedKV, qo_indptr, *, sm_scale: float | None = None,
                params: dict | None = None, out=None, lse=None):
        """q: [total_q, Hq, D]; qo_indptr: [B+1] int32. Returns (out [total_q, Hq, D], lse [total_q, Hq])."""
        check_tensor(q, "q", 3)
        dt, d = dtype_name(q), int(q.shape[2])
        qo = check_indptr(qo_indptr, "qo_indptr", int(q.shape[0]))
        batch = len(qo) - 1
        if isinstance(kv, PagedKV):
            check_paged(kv, d, dt, batch)
            fn = self._function(f"batch_prefill_paged_{kv.layout.lower()}", dt, d)
            a, b, indptr, last = kv.pages, kv.indices, kv.indptr, kv.last_page_len
        elif isinstance(kv, RaggedKV):
            check_ragged(kv, d, dt, batch)
            fn = self._function("batch_prefill_ragged", dt, d)
            a, b, indptr, last = kv.k, kv.v, kv.indptr, _int32_like(q, np.zeros(batch))
        else:
            raise AttentionArgumentError(f"kv: expected PagedKV or RaggedKV, got {type(kv).__name__}")
        check_qkv_heads(q, kv.num_kv_heads, d)
        out, lse = self._outputs(q, int(q.shape[0]), out, lse)
        extras = resolve_params(self.variant, params, num_qo_heads=int(q.shape[1]), batch_size=batch)
        scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
        fn(*map(_nonempty, (q, a, b)), indptr, last, qo_indptr, *map(_nonempty, (out, lse)), scale, *extras)
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
        fn = self._function(f"batch_decode_paged_{kv.layout.lower()}", dt, d)
        out, lse = self._outputs(q, batch, out, lse)
        extras = resolve_params(self.variant, params, num_qo_heads=int(q.shape[1]), batch_size=batch)
        scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
        fn(*map(_nonempty, (q, kv.pages, kv.indices)), kv.indptr, kv.last_page_len, kv.indptr,
           *map(_nonempty, (out, lse)), scale, *extras)
        return out, lse
