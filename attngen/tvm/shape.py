"""CacheShape: what a TVM PagedKVCache is created with besides its kernels, validated once.

TVM's ``vm.builtin.paged_attention_kv_cache_create`` takes the cache's sizes, head counts, RoPE
settings and per-layer attention kinds as positional arguments; every kernel built for the cache
(attngen's attention slots, TVM's own data-moving kernels) depends on some of them. One frozen
``CacheShape`` carries them all through the run-time and the ahead-of-time paths.
"""
from __future__ import annotations

from dataclasses import dataclass

from attngen.schedules.dtypes import is_fp8

ROPE_MODES = {"none": 0, "normal": 1, "inline": 2}  # TVM's RopeMode
ATTN_KINDS = {"mha": 0, "mha_sliding": 3}  # TVM's AttnKind (MLA has no attngen slot)


class UnsupportedCacheFeature(NotImplementedError):
    """A PagedKVCache feature that attngen's slots do not serve, refused when the cache is described."""


def _refuse_mla(kinds: tuple) -> None:
    """TVM's cache would accept MLA layers with empty MLA slots and fail only at their first forward
    (``Check failed: (f_mla_prefill_ != nullptr)``, or in the MLA append); refuse them here, by name."""
    mla = [i for i, k in enumerate(kinds) if isinstance(k, str) and k.lower() == "mla"]
    if mla:
        raise UnsupportedCacheFeature(
            f"attn_kinds: layers {mla} are 'mla' (multi-head latent attention), which attngen does not serve: "
            "TVM's MLA slots (the MLA prefill, its KV append and merge) would stay empty; attngen fills the "
            "'mha' and 'mha_sliding' slots (and the token-tree slots) only")


def _refuse_fp8(dtype: str) -> None:
    """TVM 0.27's cache keeps one dtype for its pages and for the q, k, v and o buffers of every forward (the
    fused-qkv split writes q in the cache's dtype), so an fp8 cache would turn the queries fp8 as well."""
    if is_fp8(str(dtype)):
        raise UnsupportedCacheFeature(
            f"dtype {dtype}: TVM 0.27's PagedKVCache holds its pages and its per-forward q / k / v / o buffers in "
            "one dtype, so an fp8 cache would quantise the queries too (attngen keeps queries in 16 or 32 bits); "
            "use a 16-bit cache here, or attngen's own fp8 K/V API (kv_dtypes=, CPUAttention / "
            "CUDAAttention.decode with k_scale / v_scale)")


def rope_mode_code(rope_mode) -> int:
    """TVM's RopeMode number for "none" | "normal" | "inline" (any case) or a RopeMode value."""
    if isinstance(rope_mode, str):
        if rope_mode.lower() not in ROPE_MODES:
            raise ValueError(f"rope_mode {rope_mode!r}: use one of {list(ROPE_MODES)} (or TVM's RopeMode)")
        return ROPE_MODES[rope_mode.lower()]
    if int(rope_mode) not in ROPE_MODES.values():
        raise ValueError(f"rope_mode {rope_mode!r}: use one of {list(ROPE_MODES)} (or TVM's RopeMode)")
    return int(rope_mode)


@dataclass(frozen=True)
class CacheShape:
    """A PagedKVCache's configuration. ``rope_mode`` is stored as TVM's RopeMode number and ``attn_kinds``
    as one kind per layer (default all "mha") once the shape is made.

    attn_kinds: per layer "mha" or "mha_sliding"; ``sliding_window`` is the window (in tokens, the query
    included) of the "mha_sliding" layers (TVM's per-layer sliding window; TVM wants a positive value even
    when no layer slides). support_sliding_window: per-sequence windows with attention sinks, switched on per
    sequence with TVM's ``vm.builtin.attention_kv_cache_enable_sliding_window_for_seq`` (cannot be combined
    with "mha_sliding" layers).
    """

    # sizes
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    max_batch: int
    max_total_tokens: int
    prefill_chunk: int
    dtype: str = "float32"
    page_size: int = 16
    # RoPE: "none" | "normal" (TVM's split + RoPE kernel before the cache) | "inline" (inside attention)
    rope_mode: int | str = "none"
    rope_scale: float = 1.0
    rope_theta: float = 1e4
    # sliding windows
    attn_kinds: tuple[str, ...] | None = None
    sliding_window: int = 1024
    support_sliding_window: bool = False

    def __post_init__(self):
        for name in ("num_layers", "num_qo_heads", "num_kv_heads", "head_dim", "page_size", "max_batch",
                     "max_total_tokens", "prefill_chunk"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} {getattr(self, name)}: must be positive")
        if self.num_qo_heads % self.num_kv_heads:
            raise ValueError(f"num_qo_heads {self.num_qo_heads} is not a multiple of num_kv_heads "
                             f"{self.num_kv_heads}")
        _refuse_fp8(self.dtype)
        kinds = tuple(self.attn_kinds) if self.attn_kinds is not None else ("mha",) * self.num_layers
        _refuse_mla(kinds)
        if len(kinds) != self.num_layers or any(k not in ATTN_KINDS for k in kinds):
            raise ValueError(f"attn_kinds {list(kinds)!r}: give one of {list(ATTN_KINDS)} per layer "
                             f"({self.num_layers} layers)")
        if "mha_sliding" in kinds and self.support_sliding_window:
            raise ValueError("support_sliding_window=True and 'mha_sliding' layers: TVM's cache silently drops "
                             "per-sequence windows when a layer has its own window; choose one")
        if int(self.sliding_window) <= 0:
            raise ValueError(f"sliding_window {self.sliding_window}: must be a positive number of tokens")
        object.__setattr__(self, "attn_kinds", kinds)
        object.__setattr__(self, "rope_mode", rope_mode_code(self.rope_mode))
        object.__setattr__(self, "support_sliding_window", bool(self.support_sliding_window))

    @property
    def inline_rope(self) -> bool:
        """Whether TVM applies RoPE inside attention: in INLINE mode, and for any RoPE once windows slide per
        sequence (as TVM does)."""
        none = ROPE_MODES["none"]
        return self.rope_mode == ROPE_MODES["inline"] or (self.support_sliding_window and self.rope_mode != none)

    @property
    def layer_window(self) -> int:
        """The window of the "mha_sliding" layers, 0 when no layer slides."""
        return self.sliding_window if "mha_sliding" in self.attn_kinds else 0

    @property
    def sizes(self) -> list[int]:
        """The create call's first argument: [max batch, max tokens, prefill chunk, page size, per-sequence
        sliding windows on?, per-layer window]."""
        return [self.max_batch, self.max_total_tokens, self.prefill_chunk, self.page_size,
                int(self.support_sliding_window), self.sliding_window]
