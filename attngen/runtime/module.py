"""What every built attention library shares on the Python side: loading, function lookup, outputs."""
from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import tvm_ffi

from attngen import build as build_entry
from attngen.codegen.cache import BuildCache
from attngen.ir.declarations import scalar_value
from attngen.schedules.build_config import BuildConfig, symbol
from attngen.schedules.dtypes import DTYPE_SHORT, FP8_DTYPES

from .checks import AttentionArgumentError, check_tensor, check_writable, dtype_name, read_only


def empty_like(ref, shape, dtype: str):
    """Uninitialised array of ``shape`` in ``ref``'s library (torch or numpy) and device."""
    if hasattr(ref, "detach"):
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype), device=ref.device)
    return np.empty(shape, dtype=dtype)


def contiguous(x):
    """x, or a contiguous copy of it (torch or NumPy): for callers that read packed arrays."""
    return x.contiguous() if hasattr(x, "detach") else np.ascontiguousarray(x)


def copy_into(dst, src) -> None:
    """dst[...] = src for torch tensors or NumPy arrays of the same shape."""
    if hasattr(dst, "detach"):
        dst.copy_(src)
    else:
        dst[...] = src


def scale_kwargs(k_scale, v_scale) -> dict:
    """An fp8 cache's k_scale / v_scale as keyword arguments of a call, {} where neither is given (a 16-bit
    cache's calls, which refuse scales)."""
    return {} if k_scale is None and v_scale is None else {"k_scale": k_scale, "v_scale": v_scale}


def _as_tuple(value):
    """A manifest's JSON lists as the tuples BuildConfig holds (nested: tvm_constants' pairs)."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list) else value


def resolve_sm_scale(sm_scale: float | None, head_dim: int) -> float:
    """The scale applied to q.k: 1/sqrt(head_dim) unless given; a given one must be a finite number that float32
    (the kernels' type) holds: a NaN or infinite scale would make every output NaN."""
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    value, problem = scalar_value("float32", sm_scale)
    if problem is None and not math.isfinite(value):
        problem = f"{value} is not finite"
    if problem:
        raise AttentionArgumentError(f"sm_scale: {problem}; pass a finite number (the scale of q.k), or leave it "
                                     f"out for 1/sqrt(head_dim) = {1.0 / math.sqrt(head_dim):g}")
    return value


def exportable(x):
    """x as the FFI functions take an input: a read-only NumPy array (which DLPack cannot export, though the
    functions only read it) copied, anything else as it is."""
    return x.copy() if read_only(x) else x


def int32_like(ref, values):
    if hasattr(ref, "detach"):
        import torch

        return torch.as_tensor(np.asarray(values, dtype=np.int32), device=ref.device)
    return np.asarray(values, dtype=np.int32)


class BuiltModule:
    """A library from ``attngen.build`` plus its manifest, for one variant."""

    def __init__(self, variant, library: str | Path, manifest: dict | None = None):
        self.variant = variant
        if library is None:  # BuildResult.library of a build that links nothing
            raise ValueError(f"variant {variant.name!r}: the build has no library to load (a "
                             "BuildConfig(link='check') build compiles device code only); build with link='whole' "
                             "or link='lto' to run it")
        self.library = Path(library)
        if manifest is None:
            manifest = json.loads((self.library.parent / "manifest.json").read_text())
        if manifest.get("variant") != variant.name:
            raise ValueError(f"{self.library} was built for variant {manifest.get('variant')!r}, "
                             f"not {variant.name!r}")
        self.manifest = manifest
        self.functions = set(manifest["functions"])
        self._mod = tvm_ffi.load_module(str(self.library))
        self._without_mask = None  # the unmasked sibling, built on first use (without_mask)

    def prepared_scales(self, q, kv, k_scale, v_scale) -> dict:
        """``k_scale`` / ``v_scale`` of calls over ``kv`` as keyword arguments, converted once into the form the
        functions take where converting costs device work (the CUDA backend's [Hkv] tensors), for a view that
        passes them to several calls (a cascade's levels); {} where none is given."""
        return scale_kwargs(k_scale, v_scale)

    def sibling(self, variant) -> "BuiltModule":
        """``variant``'s library built with this library's configuration (its manifest's), into the cache this
        one came from where that cache is writable (else the default cache)."""
        fields = {f.name for f in dataclasses.fields(BuildConfig)}
        config = BuildConfig(**{k: _as_tuple(v) for k, v in self.manifest["config"].items() if k in fields})
        entry = self.library.parent  # a cache entry is <root>/<key[:2]>/<key>/
        cached = entry.parent.name == entry.name[:2] and (entry / "manifest.json").exists()
        root = entry.parent.parent
        cache = BuildCache(root) if cached and os.access(root, os.W_OK) else None
        res = build_entry.build(variant, config, cache=cache)
        return type(self)(variant, res.library, res.manifest)

    def without_mask(self) -> "BuiltModule":
        """The library of this variant without its mask (``Variant.without_mask``), built with this configuration
        on first use and kept, so that every view showing some keys whole (cascade levels, block rows) shares it."""
        if self._without_mask is None:
            self._without_mask = self.sibling(self.variant.without_mask())
        return self._without_mask

    def function(self, kind: str, dtype: str, head_dim: int, kv_dtype: str | None = None):
        """The exported function of ``kind`` for queries of ``dtype`` (and K/V of ``kv_dtype``, None or equal:
        the query's), or an error naming the build options that would export it."""
        unknown = sorted({dtype, kv_dtype or dtype} - set(DTYPE_SHORT))
        if unknown:  # no library of any build has kernels for these: name the tensor, not a symbol
            tensor = "q" if dtype in unknown else "kv"
            raise AttentionArgumentError(f"{tensor}: dtype {unknown[0]} has no kernels; attngen serves "
                                         f"{sorted(DTYPE_SHORT)} (convert the tensor)")
        if dtype in FP8_DTYPES:  # fp8 stores K/V; no build has fp8 queries
            raise AttentionArgumentError(f"q: dtype {dtype}: fp8 is a K/V cache format (with k_scale / v_scale); "
                                         f"queries are float16 or bfloat16 (float32 on the CPU): convert q")
        name = symbol(kind, dtype, head_dim, kv_dtype)
        if name not in self.functions:
            pairing = f" paired with kv_dtypes {kv_dtype}" if kv_dtype not in (None, dtype) else ""
            raise AttentionArgumentError(
                f"{self.library.name} has no {name}: it was built for {sorted(self.functions)}; rebuild with "
                f"dtypes including {dtype}{pairing}, head_dims including {head_dim} and the needed layout")
        return self._mod[name]

    @staticmethod
    def outputs(q, n_rows: int, out, lse):
        """(out [n_rows, Hq, D] like q, lse [n_rows, Hq] float32), allocated or checked."""
        n_qo, d = int(q.shape[1]), int(q.shape[2])
        dt = dtype_name(q)
        if out is None:
            out = empty_like(q, (n_rows, n_qo, d), dt)
        check_tensor(out, "out", 3, dt)
        check_writable(out, "out", "pass a writable array, or leave out= out to have one allocated")
        if tuple(out.shape) != (n_rows, n_qo, d):
            raise AttentionArgumentError(f"out: shape {tuple(out.shape)}, expected {(n_rows, n_qo, d)}")
        if lse is None:
            lse = empty_like(q, (n_rows, n_qo), "float32")
        check_tensor(lse, "lse", 2, "float32")
        check_writable(lse, "lse", "pass a writable array, or leave lse= out to have one allocated")
        if tuple(lse.shape) != (n_rows, n_qo):
            raise AttentionArgumentError(f"lse: shape {tuple(lse.shape)}, expected {(n_rows, n_qo)}")
        return out, lse
