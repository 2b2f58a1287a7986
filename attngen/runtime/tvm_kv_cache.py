"""Plugging attngen functions into TVM's PagedKVCache (``vm.builtin.paged_attention_kv_cache_create``).

- ``merge_slot_function``: the merge slot. TVM calls it as ``f(o, lse, o_other, lse_other)``
  with o [n, H, D] and lse [n, H] float32 in base 2, merging in place; attngen's CPU merge
  has exactly that calling convention and also accepts TVM's -5e4 "no key" lse as well as -inf.
- ``attention_slot_functions``: the five ``("tirx", fn)`` attention slots (ragged prefill,
  paged prefill, decode, and their sliding-window forms) for a variant, built by the CPU
  backend (:mod:`attngen.codegen.cpu.tvm_slots` says what they compute).
- ``create_paged_kv_cache``: a whole PagedKVCache whose attention and merge slots are
  attngen's; its data-moving kernels (append, debug read, split+RoPE, page copy, compact)
  are TVM's own.

A cache is used through TVM's ordinary builtins (``vm.builtin.kv_state_add_sequence``,
``kv_state_begin_forward``, ``attention_kv_cache_attention_with_fused_qkv``, ...).
The variant's hooks see TVM's token positions; TVM's ``causal`` flag and sliding windows
apply on top of the variant's own mask.
"""
from __future__ import annotations

import functools
from typing import Sequence

CPU_MERGE_DTYPES = ("float32", "float16")
ROPE_MODES = {"none": 0, "normal": 1, "inline": 2}  # TVM's RopeMode
ATTN_KINDS = {"mha": 0, "mha_sliding": 3}  # TVM's AttnKind (MLA has no attngen slot)
SLOT_ROLES = ("prefill_ragged", "prefill", "decode", "prefill_sliding_window", "decode_sliding_window")


def merge_slot_function(dtype: str = "float32"):
    """The function to pass in the create call's merge tuple, e.g. ``[merge_slot_function("float32")]``."""
    from attngen.schedules.build_config import DTYPE_SHORT

    from .state import _cpu_library

    if dtype not in CPU_MERGE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: the CPU merge slot serves {list(CPU_MERGE_DTYPES)}")
    return _cpu_library()[f"merge_state_inplace_{DTYPE_SHORT[dtype]}"]


def _rope_mode(rope_mode) -> int:
    if isinstance(rope_mode, str):
        if rope_mode.lower() not in ROPE_MODES:
            raise ValueError(f"rope_mode {rope_mode!r}: use one of {list(ROPE_MODES)} (or TVM's RopeMode)")
        return ROPE_MODES[rope_mode.lower()]
    if int(rope_mode) not in ROPE_MODES.values():
        raise ValueError(f"rope_mode {rope_mode!r}: use one of {list(ROPE_MODES)} (or TVM's RopeMode)")
    return int(rope_mode)


def _check_target(target: str, *, cuda_ok: bool = False) -> None:
    if target == "cuda" and not cuda_ok:
        raise NotImplementedError(
            "target='cuda': attention_slot_functions builds the CPU slots; for a CUDA cache call "
            "create_paged_kv_cache(..., target='cuda') (attngen.runtime.tvm_kv_cache_cuda)")
    if target not in ("cpu", "cuda"):
        raise ValueError(f"target {target!r}: attngen fills TVM PagedKVCache slots for target='cpu' or 'cuda'")


@functools.lru_cache(maxsize=None)
def _load(path: str):
    import tvm_ffi

    return tvm_ffi.load_module(path)


def _bind_trailing(fn, tensors: list):
    """``fn`` with the variant's tensor parameters appended to TVM's arguments on every call."""
    import tvm

    def call(*args):
        return fn(*args, *tensors)

    return tvm.runtime.convert(call)


def _split_params(variant, params: dict | None, num_qo_heads: int, max_batch: int) -> tuple[dict, list]:
    """(scalar values by name, tensor values in declaration order as CPU tvm tensors)."""
    import numpy as np
    import tvm

    from attngen.ir import TensorParam

    from .params import resolve_params

    values = resolve_params(variant, params, num_qo_heads=num_qo_heads, batch_size=max_batch)
    scalars, tensors = {}, []
    for decl, value in zip(variant.params, values):
        if isinstance(decl, TensorParam):
            array = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
            tensors.append(tvm.runtime.tensor(np.ascontiguousarray(array), device=tvm.cpu()))
        else:
            scalars[decl.name] = value
    return scalars, tensors


def attention_slot_functions(variant=None, *, num_qo_heads: int, head_dim: int, dtype: str = "float32",
                             rope_mode="none", support_sliding_window: bool = False,
                             sliding_window: int | None = None, params: dict | None = None,
                             max_batch: int = 1, target: str = "cpu", cache=None) -> dict:
    """Role -> function for the create call's five attention slots (wrap each as ``["tirx", fn]``).

    variant: an attngen Variant (default vanilla); its scalar parameters from ``params`` are
    compiled in, its tensor parameters are bound to each call. rope_mode: the cache's RoPE mode
    ("none" | "normal" | "inline" or TVM's RopeMode); a cache with ``support_sliding_window``
    turns any RoPE into inline RoPE, as TVM does. sliding_window: the window (in tokens, the
    query included) of the cache's "mha_sliding" layers, None if it has none.
    """
    from attngen.codegen.cpu.tvm_slots import build_slot_library, check_slot_variant, slot_specs
    from attngen.variants import builtin

    _check_target(target)
    variant = variant if variant is not None else builtin("vanilla")
    check_slot_variant(variant)
    if head_dim <= 0:
        raise ValueError(f"head_dim {head_dim}: must be positive")
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"sliding_window {sliding_window}: must be a positive number of tokens")
    mode = _rope_mode(rope_mode)
    # TVM applies RoPE inside attention for INLINE, and for any RoPE once windows slide per sequence
    inline = mode == ROPE_MODES["inline"] or (support_sliding_window and mode != ROPE_MODES["none"])
    scalars, tensors = _split_params(variant, params, num_qo_heads, max_batch)
    specs = slot_specs(variant, head_dim, dtype, inline_rope=inline, window=sliding_window or 0)
    kwargs = {"cache": cache} if cache is not None else {}
    library = _load(str(build_slot_library(variant, specs, scalars, **kwargs)))
    out = {}
    for role in SLOT_ROLES:
        fn = library[specs[role].func_name]
        out[role] = _bind_trailing(fn, tensors) if tensors else fn
    return out


def _check_cache_args(*, num_layers, num_qo_heads, num_kv_heads, page_size, max_batch, max_total_tokens,
                      prefill_chunk, attn_kinds, support_sliding_window) -> list[str]:
    """Validate a cache's shape arguments; returns the per-layer attention kinds."""
    for name, value in (("num_layers", num_layers), ("num_qo_heads", num_qo_heads),
                        ("num_kv_heads", num_kv_heads), ("page_size", page_size), ("max_batch", max_batch),
                        ("max_total_tokens", max_total_tokens), ("prefill_chunk", prefill_chunk)):
        if int(value) <= 0:
            raise ValueError(f"{name} {value}: must be positive")
    if num_qo_heads % num_kv_heads:
        raise ValueError(f"num_qo_heads {num_qo_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    kinds = list(attn_kinds) if attn_kinds is not None else ["mha"] * num_layers
    if len(kinds) != num_layers or any(k not in ATTN_KINDS for k in kinds):
        raise ValueError(f"attn_kinds {kinds!r}: give one of {list(ATTN_KINDS)} per layer ({num_layers} layers)")
    if "mha_sliding" in kinds and support_sliding_window:
        raise ValueError("support_sliding_window=True and 'mha_sliding' layers: TVM's cache silently drops "
                         "per-sequence windows when a layer has its own window; choose one")
    return kinds


def create_paged_kv_cache(variant=None, *, num_layers: int, num_qo_heads: int, num_kv_heads: int,
                          head_dim: int, dtype: str = "float32", page_size: int = 16, max_batch: int,
                          max_total_tokens: int, prefill_chunk: int, rope_mode="none",
                          rope_scale: float = 1.0, rope_theta: float = 1e4,
                          attn_kinds: Sequence[str] | None = None, sliding_window: int = 1024,
                          support_sliding_window: bool = False, params: dict | None = None,
                          target: str = "cpu", cache=None, convention: str = "tirx"):
    """A TVM PagedKVCache (CPU) whose attention slots run ``variant`` (default vanilla) and whose
    merge slot is attngen's merge.

    attn_kinds: per layer "mha" or "mha_sliding" (default all "mha"); sliding_window is the window
    of the "mha_sliding" layers (TVM's per-layer sliding window). support_sliding_window: per-
    sequence windows with attention sinks, switched on per sequence with TVM's
    ``vm.builtin.attention_kv_cache_enable_sliding_window_for_seq`` (cannot be combined with
    "mha_sliding" layers). params: values of the variant's extra parameters (defaults apply).
    Token-tree attention (speculative decoding) and MLA are not served: their slots stay empty.
    target="cuda" (tvm_kv_cache_cuda.py): ``convention`` "tirx" or "flashinfer" for the CUDA slots.
    """
    import tvm

    from attngen.codegen.cpu.tvm_cache_kernels import SYMBOLS, build_tvm_cache_kernels

    _check_target(target, cuda_ok=True)
    kinds = _check_cache_args(num_layers=num_layers, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                              page_size=page_size, max_batch=max_batch, max_total_tokens=max_total_tokens,
                              prefill_chunk=prefill_chunk, attn_kinds=attn_kinds,
                              support_sliding_window=support_sliding_window)
    layer_windows = "mha_sliding" in kinds
    if target == "cuda":
        from attngen.variants import builtin

        from .tvm_kv_cache_cuda import create_paged_kv_cache_cuda

        if support_sliding_window:
            raise ValueError("support_sliding_window=True: attngen's CUDA slots do not serve per-sequence windows yet")
        return create_paged_kv_cache_cuda(
            variant if variant is not None else builtin("vanilla"), num_layers=num_layers,
            num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
            page_size=page_size, max_batch=max_batch, max_total_tokens=max_total_tokens, prefill_chunk=prefill_chunk,
            rope_mode=_rope_mode(rope_mode), rope_scale=rope_scale, rope_theta=rope_theta, kinds=kinds, params=params,
            cache=cache, convention=convention)
    slots = attention_slot_functions(
        variant, num_qo_heads=num_qo_heads, head_dim=head_dim, dtype=dtype, rope_mode=rope_mode,
        support_sliding_window=support_sliding_window, sliding_window=sliding_window if layer_windows else None,
        params=params, max_batch=max_batch, target=target, cache=cache)
    kwargs = {"cache": cache} if cache is not None else {}
    helpers = _load(str(build_tvm_cache_kernels(
        num_layers=num_layers, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        dtype=dtype, page_size=page_size, rope_scale=float(rope_scale), rope_theta=float(rope_theta),
        **kwargs)))
    k = {role: helpers[sym] for role, sym in SYMBOLS.items()}
    return create_call(
        sizes=[max_batch, max_total_tokens, prefill_chunk, page_size, int(support_sliding_window), sliding_window],
        num_layers=num_layers, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, kinds=kinds,
        rope_mode=_rope_mode(rope_mode), rope_scale=rope_scale, rope_theta=rope_theta,
        dtype_token=tvm.runtime.empty((), dtype, device=tvm.cpu()), helpers=k,
        slots=[["tirx", slots[r]] for r in ("prefill_ragged", "prefill", "decode", "prefill_sliding_window",
                                             "decode_sliding_window")],
        merge=merge_slot_function(dtype))


# TVM's create call requires a positive per-layer window even when no layer slides
PLACEHOLDER_WINDOW = 1024


def create_call(*, sizes: list, num_layers: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, kinds: list,
                rope_mode: int, rope_scale: float, rope_theta: float, dtype_token, helpers: dict, slots: list, merge):
    """Call ``vm.builtin.paged_attention_kv_cache_create`` at run time (CPU and CUDA caches): ``sizes`` =
    [max batch, max tokens, prefill chunk, page size, per-sequence sliding windows on?, per-layer window],
    ``dtype_token`` an empty tensor of the cache's dtype on its device, ``helpers`` TVM's data-moving kernels
    by role, ``slots`` the five attention slot lists (ragged prefill, paged prefill, decode, and the
    sliding-window prefill and decode), ``merge`` the merge function."""
    import tvm
    from tvm.runtime import ShapeTuple

    return tvm.get_global_func("vm.builtin.paged_attention_kv_cache_create")(
        ShapeTuple(sizes), ShapeTuple([0, num_layers]), num_qo_heads, num_kv_heads, head_dim, head_dim,
        ShapeTuple([ATTN_KINDS[x] for x in kinds]), False, rope_mode, float(rope_scale), float(rope_theta), None,
        dtype_token, helpers["transpose_append"], None,  # no MLA append
        *slots, [], [], [],  # token-tree attention (paged, ragged) and MLA: not served
        [merge], helpers["split_rotary"], helpers["copy_single_page"], helpers["debug_get_kv"],
        helpers["compact_copy"])
