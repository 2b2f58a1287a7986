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

import tvm_ffi

from attngen import build as build_entry
from attngen.schedules.build_config import merge_symbol

from .checks import AttentionArgumentError, check_tensor, dtype_name
from .cuda import current_arch
from .module import empty_like


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


def merge_state(v, s, v_other, s_other):
    """In place: (v, s) <- merge((v, s), (v_other, s_other)). v: [n, H, D]; s: [n, H] float32."""
    check_tensor(v, "v", 3)
    check_tensor(v_other, "v_other", 3, dtype_name(v))
    check_tensor(s, "s", 2, "float32")
    check_tensor(s_other, "s_other", 2, "float32")
    if tuple(v.shape) != tuple(v_other.shape) or tuple(s.shape) != tuple(v.shape[:2]) or \
            tuple(s_other.shape) != tuple(s.shape):
        raise AttentionArgumentError(f"v, s, v_other, s_other: shapes {tuple(v.shape)}, {tuple(s.shape)}, "
                                     f"{tuple(v_other.shape)}, {tuple(s_other.shape)} do not describe two "
                                     "[n, H, D] / [n, H] states")
    if int(v.shape[0]) * int(v.shape[1]):
        _fn("merge_state_inplace", v)(v, s, v_other, s_other)
    return v, s


def merge_states(v, s, out=None, out_lse=None):
    """v: [n, K, H, D], s: [n, K, H] float32 -> (v_merged [n, H, D], s_merged [n, H])."""
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
    if n * h:
        _fn("merge_states", v)(v, s, out, out_lse)
    return out, out_lse


def merge_states_sum(v, out=None):
    """Unnormalised (sum-state) partial outputs add: v [n, K, H, D] -> [n, H, D]."""
    check_tensor(v, "v", 4)
    n, _, h, d = (int(x) for x in v.shape)
    out = empty_like(v, (n, h, d), dtype_name(v)) if out is None else out
    check_tensor(out, "out", 3, dtype_name(v))
    if tuple(out.shape) != (n, h, d):
        raise AttentionArgumentError(f"out: shape {tuple(out.shape)}, expected {(n, h, d)}")
    if n * h:
        _fn("merge_states_sum", v)(v, out)
    return out
