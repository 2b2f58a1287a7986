"""Composing attention states: merge_state (in place), merge_states (K per row), the sum merge.

A state is (v, s): v [n, H, D] the normalised output over some keys, s [n, H] its base-2
log-sum-exp. Merging is exact up to rounding, associative and commutative; an empty
state (s = -inf) passes the other through and two empty states stay empty (0, -inf).
Runs on the CPU backend (TIR built by LLVM) for NumPy arrays and CPU torch tensors, and on
CUDA kernels (``csrc/merge_states.cu``) for CUDA tensors, on the current stream; both libraries
come from the build entry point (:func:`attngen.build.support_library`), built on first use.
"""
from __future__ import annotations

import functools

import numpy as np
import tvm_ffi

from attngen import build as build_entry
from attngen.schedules.build_config import merge_symbol

from .checks import AttentionArgumentError, check_tensor, check_writable, dtype_name
from .cuda import current_arch
from .module import empty_like, exportable


@functools.lru_cache(maxsize=None)
def _cpu_library():
    return tvm_ffi.load_module(str(build_entry.support_library("merge_cpu")))


@functools.lru_cache(maxsize=None)
def _cuda_library(arch: str):
    return tvm_ffi.load_module(str(build_entry.support_library("merge_cuda", archs=(arch,))))


def _fn(kind: str, v):
    dt = dtype_name(v)
    on_gpu = hasattr(v, "detach") and v.device.type == "cuda"
    allowed = ("float32", "float16", "bfloat16") if on_gpu else ("float32", "float16")
    if dt not in allowed:
        raise AttentionArgumentError(f"v: dtype {dt} is not supported by state merging here; use one of {allowed}")
    if on_gpu:
        return _cuda_library(current_arch())[merge_symbol(kind, dt)]
    return _cpu_library()[merge_symbol(kind, dt)]


def _fill(x, value: float) -> None:
    """x[...] = value (torch tensor or NumPy array)."""
    if hasattr(x, "detach"):
        x.fill_(value)
    else:
        x[...] = value


def _row_mask(mask, v, n: int):
    """``mask`` checked as merge_state's: a bool [n] array of v's library (and, for torch, its device)."""
    check_tensor(mask, "mask", 1, "bool")
    if int(mask.shape[0]) != n:
        raise AttentionArgumentError(f"mask: shape {tuple(mask.shape)}, expected ({n},): one flag per state row")
    if hasattr(v, "detach") != hasattr(mask, "detach") or (hasattr(v, "detach") and mask.device != v.device):
        where = v.device if hasattr(v, "detach") else "a NumPy array"
        raise AttentionArgumentError(f"mask: must be in v's library and on its device ({where})")
    return mask


def merge_state(v, s, v_other, s_other, mask=None):
    """In place: (v, s) <- merge((v, s), (v_other, s_other)). v: [n, H, D]; s: [n, H] float32.
    ``mask``: bool [n] (FlashInfer's ``merge_state_in_place(..., mask)``): rows whose flag is False keep (v, s)
    exactly, whatever v_other / s_other hold there (rows of a batch a CUDA graph runs padded); on the device,
    without a host round trip."""
    check_tensor(v, "v", 3)
    check_tensor(v_other, "v_other", 3, dtype_name(v))
    check_tensor(s, "s", 2, "float32")
    check_tensor(s_other, "s_other", 2, "float32")
    if tuple(v.shape) != tuple(v_other.shape) or tuple(s.shape) != tuple(v.shape[:2]) or \
            tuple(s_other.shape) != tuple(s.shape):
        raise AttentionArgumentError(f"v, s, v_other, s_other: shapes {tuple(v.shape)}, {tuple(s.shape)}, "
                                     f"{tuple(v_other.shape)}, {tuple(s_other.shape)} do not describe two "
                                     "[n, H, D] / [n, H] states")
    if mask is not None:
        mask = _row_mask(mask, v, int(v.shape[0]))
    for name, x in (("v", v), ("s", s)):
        check_writable(x, name, "merge_state merges in place: pass writable arrays (x.copy())")
    v_other, s_other = exportable(v_other), exportable(s_other)
    if not int(v.shape[0]) * int(v.shape[1]):
        return v, s
    if mask is None:
        _fn("merge_state_inplace", v)(v, s, v_other, s_other)
        return v, s
    merged_v, merged_s = (x.clone() if hasattr(x, "detach") else x.copy() for x in (v, s))
    _fn("merge_state_inplace", v)(merged_v, merged_s, v_other, s_other)
    if hasattr(v, "detach"):
        v.copy_(merged_v.where(mask[:, None, None], v))
        s.copy_(merged_s.where(mask[:, None], s))
    else:
        np.copyto(v, merged_v, where=mask[:, None, None])
        np.copyto(s, merged_s, where=mask[:, None])
    return v, s


def merge_states(v, s, out=None, out_lse=None):
    """v: [n, K, H, D], s: [n, K, H] float32 -> (v_merged [n, H, D], s_merged [n, H]); K = 0 gives empty states."""
    check_tensor(v, "v", 4)
    check_tensor(s, "s", 3, "float32")
    n, k, h, d = (int(x) for x in v.shape)
    if tuple(s.shape) != (n, k, h):
        raise AttentionArgumentError(f"s: shape {tuple(s.shape)}, expected {(n, k, h)}")
    out = empty_like(v, (n, h, d), dtype_name(v)) if out is None else out
    out_lse = empty_like(v, (n, h), "float32") if out_lse is None else out_lse
    check_tensor(out, "out", 3, dtype_name(v))
    check_tensor(out_lse, "out_lse", 2, "float32")
    if tuple(out.shape) != (n, h, d) or tuple(out_lse.shape) != (n, h):
        raise AttentionArgumentError(f"out, out_lse: shapes {tuple(out.shape)}, {tuple(out_lse.shape)}, expected "
                                     f"{(n, h, d)}, {(n, h)}")
    check_writable(out, "out", "pass a writable array, or leave out= out to have one allocated")
    check_writable(out_lse, "out_lse", "pass a writable array, or leave out_lse= out to have one allocated")
    if n * h:
        fn = _fn("merge_states", v)  # (refuses a dtype without kernels, also where K = 0)
        if k == 0:  # merging no state gives the empty state (O = 0, lse = -inf), as merging two empty ones does
            _fill(out, 0.0)
            _fill(out_lse, -np.inf)
        else:
            fn(exportable(v), exportable(s), out, out_lse)
    return out, out_lse


def merge_states_sum(v, out=None):
    """Unnormalised (sum-state) partial outputs add: v [n, K, H, D] -> [n, H, D] (zeros where K = 0)."""
    check_tensor(v, "v", 4)
    n, k, h, d = (int(x) for x in v.shape)
    out = empty_like(v, (n, h, d), dtype_name(v)) if out is None else out
    check_tensor(out, "out", 3, dtype_name(v))
    if tuple(out.shape) != (n, h, d):
        raise AttentionArgumentError(f"out: shape {tuple(out.shape)}, expected {(n, h, d)}")
    check_writable(out, "out", "pass a writable array, or leave out= out to have one allocated")
    if n * h:
        fn = _fn("merge_states_sum", v)
        if k == 0:  # no partial output: the sum of none
            _fill(out, 0.0)
        else:
            fn(exportable(v), out)
    return out
