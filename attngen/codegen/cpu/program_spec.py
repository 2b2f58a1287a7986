"""What a CPU attention program is specialised for, and the functions cut from it: the online-softmax program's
parameters and knobs (:class:`ProgramSpec`, its TVM convention :class:`TVMConvention`, a variant's
:func:`kernel_flags`), and attngen's exported CPU functions (:class:`CPUKernelSpec`, their signatures, cut from the
program by :func:`with_signature`). The program itself: :mod:`.attention_tir`.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm.tirx as tir

from attngen.ir import HOOKS, Site, StateAlgebra
from attngen.ir.mask_class import constant_bounds
from attngen.schedules.dtypes import is_fp8


# online_softmax_program's parameters, in its own order.
PROGRAM_PARAMS = ("q", "qo_indptr", "k", "v", "kv_indptr", "pages", "page_indptr", "page_indices",
                  "length_info", "q_rope_position", "k_rope_pos_offset", "o", "lse", "k_scale", "v_scale",
                  "causal", "rotary_mode", "rope_scale", "rope_theta", "sm_scale", "tree_mn_indptr", "tree_order")


@dataclass(frozen=True)
class TVMConvention:
    """TVM PagedKVCache's slot convention: positions from ``q_rope_position`` / ``k_rope_pos_offset``,
    a run-time ``causal`` flag on prefill, ``rotary_mode`` asserted, lse = attention_tir.NO_KEY_LSE for a row
    that sees no key."""

    sliding_length_info: bool = False  # length_info[3, B] = (last_page_len, sliding_window_offset, sink_size)
    # a key is visible only when qo_pos - kv_pos < window (0: none), whatever ``causal`` says: TVM hands the
    # sliding-window slots of "mha_sliding" layers keys beyond the window when a shared prefix (a fork) splits
    # a sequence over depths, and calls the prefill slot with causal=0 when the new tokens are already in pages
    window: int = 0
    inline_rope: bool = False  # TVM's RoPE on q and k before the hooks (rotary_mode 1; else rotary_mode 0)
    name: str = "attention"  # the function's name, for its run-time error
    # token-tree attention (speculative decoding): TVM's tree mask replaces ``causal`` (prefill only); the
    # ragged form takes its key positions from ``q_rope_position`` (its keys are its queries' tokens)
    tree_mask: bool = False
    # length_info is [B] or [3, B], told apart at run time by its ndim (TVM's paged tree slot, called for "mha"
    # and "mha_sliding" layers alike); the window then applies to the [3, B] calls ("mha_sliding" layers) only
    length_info_ndim_at_run_time: bool = False


@dataclass(frozen=True)
class ProgramSpec:
    """What one online-softmax program is specialised for (shape and schedule knobs)."""

    head_dim: int
    dtype: str  # q/o element type (and k/v's unless kv_dtype): "float32" | "float16" | "bfloat16"
    kv: str  # "ragged": k, v [total_kv, Hkv, D] | "paged": pages with a page table
    decode: bool = False  # one query per request (paged only): q [B, Hq, D], no qo_indptr
    page_layout: str = "NHD"  # "NHD": pages [P, 2, S, Hkv, D] | "HND": pages [P, 2, Hkv, S, D]
    tvm: TVMConvention | None = None  # TVM's slot convention, or None for attngen's own
    transform_keys: bool = False  # a key hook applies: keys are transformed once per call
    softmax: bool = True  # False: unnormalised sum state (lse = 0)
    q_scale_log2e: bool = True  # fold log2(e) into the query scale (no hook rewrites scores)
    kv_dtype: str | None = None  # K/V element type when not ``dtype``: an fp8 format, read with scales
    # attngen's convention: every key the mask lets through has qo_pos - kv_pos >= this (kernel_flags), so a row's
    # key loop ends at kv_pos = qo_pos - this (a causal mask: the row's own position); None: every key is tried
    min_qo_minus_kv: int | None = None

    def __post_init__(self):
        if self.decode and self.kv != "paged":
            raise ValueError("decode kernels read a paged KV cache")
        if self.kv_dtype not in (None, self.dtype) and not is_fp8(self.kv_dtype):
            raise ValueError(f"K/V dtype {self.kv_dtype} with query dtype {self.dtype}: only fp8 K/V differ")

    @property
    def fp8(self) -> bool:
        return self.kv_dtype is not None and is_fp8(self.kv_dtype)


def kernel_flags(variant) -> dict:
    """The variant-dependent knobs of a kernel spec: whether keys pass a hook at load, the state, the
    scale folding. The other hooks need no knob: they are inlined at their placeholders."""
    return dict(
        transform_keys=any(HOOKS[h].site is Site.KEY_LOAD for h in variant.hooks),
        softmax=variant.state == StateAlgebra.SOFTMAX,
        q_scale_log2e=variant.analysis.scale.q_scale_log2e,
        min_qo_minus_kv=constant_bounds(variant)[0],  # (None: unbounded)
    )



def with_signature(program: tir.PrimFunc, names: tuple[str, ...]) -> tir.PrimFunc:
    """``program`` taking only the parameters ``names`` (of ``PROGRAM_PARAMS``), in that order."""
    by_name = dict(zip(PROGRAM_PARAMS, program.params, strict=True))
    return tir.PrimFunc([by_name[n] for n in names], program.body, program.ret_type, program.attrs)


@dataclass(frozen=True)
class CPUKernelSpec:
    """What one of attngen's exported CPU attention functions is specialised for."""

    kv: str  # "ragged" | "paged"
    decode: bool  # one query per request, q[B, Hq, D] (paged only)
    head_dim: int
    dtype: str  # q/o element type (and k/v's unless kv_dtype): "float32" | "float16" | "bfloat16"
    layout: str = "NHD"  # paged layout: "NHD" pages[P, 2, S, Hkv, D] | "HND" pages[P, 2, Hkv, S, D]
    transform_keys: bool = False  # the variant's keys pass a hook at load (see kernel_flags)
    softmax: bool = True  # False: unnormalised sum state
    q_scale_log2e: bool = True  # fold log2(e) into the query scale (no hook rewrites scores)
    kv_dtype: str | None = None  # K/V element type when not ``dtype`` (an fp8 format): takes k_scale, v_scale
    min_qo_minus_kv: int | None = None  # the mask's bound on qo_pos - kv_pos (see kernel_flags)

    @property
    def func_name(self) -> str:
        if self.decode:
            return f"batch_decode_paged_{self.layout.lower()}"
        return f"batch_prefill_{self.kv}" + (f"_{self.layout.lower()}" if self.kv == "paged" else "")

    def program(self) -> ProgramSpec:
        return ProgramSpec(self.head_dim, self.dtype, self.kv, self.decode, self.layout,
                           transform_keys=self.transform_keys, softmax=self.softmax,
                           q_scale_log2e=self.q_scale_log2e, kv_dtype=self.kv_dtype,
                           min_qo_minus_kv=self.min_qo_minus_kv)


# attngen's CPU calling convention, per kind: each argument means one thing.
CPU_SIGNATURES = {
    "ragged": ("q", "qo_indptr", "k", "v", "kv_indptr", "o", "lse", "sm_scale"),
    "paged": ("q", "qo_indptr", "pages", "page_indptr", "page_indices", "length_info", "o", "lse", "sm_scale"),
    "decode": ("q", "pages", "page_indptr", "page_indices", "length_info", "o", "lse", "sm_scale"),
}
FP8_SCALE_PARAMS = ("k_scale", "v_scale")  # fp8 K/V functions: [Hkv] float32 each, just before sm_scale
