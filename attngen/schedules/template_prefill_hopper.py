"""The Hopper prefill / append template (csrc/hopper_prefill.cuh: HopperTile<D>, hopper_prefill_smem_bytes).

sm_90a only (wgmma, setmaxnreg): three warpgroups per CTA, a producer gathering K/V tiles with cp.async
into ``STAGES`` shared-memory stages each for K and for V (paged or ragged alike) and two consumers of 64 query rows each
(128 packed rows per CTA) running S = Q K^T and O += P V on wgmma with the softmax in registers. Tiles
are 128-byte swizzled (their own 1024-byte alignment slack is counted); keys per tile: 128 at head_dim
64 and 128, 64 at 256 (the 64 x 256 fp32 output accumulators take half a consumer thread's registers), and
176 at 128 and 192 at 64 (``wide``; one query buffer at 128) for kernels that check no score beyond the key
range: no mask hook, no tile map, no key transform, a 16-bit cache, none of TVM's conventions
(csrc/hopper_tile.cuh hopper_wide_tiles).
The prefill record's entries launch it on devices of compute capability 9.0 when the library was built
for sm_90a (a companion of ``prefill``), so it exports nothing itself.

The K/V stages hold tiles of the query dtype whatever the cache's: an fp8 cache's rows are copied into the
upper half of their stage and widened there (csrc/hopper_fp8_stage.cuh), so its shared memory is a 16-bit
cache's (a separate staging area would not fit at head_dim 128 with two query buffers, nor at 256).
"""
from __future__ import annotations

from dataclasses import dataclass

from attngen.ir.hook_spec import row_hooks

from .cxx_tables import cxx_constant, cxx_table
from .dtypes import ElementBytes
from .templates import ArchNeeds, FitQuery, TemplateRecord

HEAD_DIMS = (64, 128, 256)
CONSUMERS = 2  # consumer warpgroups of 64 rows
STAGES = {64: 3, 128: 2, 256: 2}  # K / V stages per head dim (csrc/hopper_tile.cuh kStages)
THREADS = 128 * (1 + CONSUMERS)
ITEM_BYTES = 48  # csrc/hopper_tile.cuh HopperItem: ten ints and a pointer, 8-byte aligned
TAIL_BYTES = (8 + 1) * 16  # a CTA's pieces of a tail split and their count (kTailMaxPieces int4 + 16 bytes)


WIDE_KEYS = {64: 192, 128: 176}  # keys per wide tile, by head dim (csrc/hopper_tile.cuh HopperTile<D, true>)
WIDE_HEAD_DIMS = tuple(WIDE_KEYS)  # head dims with a wide tiling
# query rows of a call's longest request from which a variant with both tilings takes the wide one
# (csrc/hopper_tile.cuh kHopperWideRows, hopper_wide_for_long_rows)
WIDE_LONG_ROWS = 8192


@dataclass(frozen=True)
class HopperConfig:
    head_dim: int
    wide: bool = False  # WIDE_KEYS keys per tile (one query buffer at head dim 128)

    @property
    def rows(self) -> int:
        return 64 * CONSUMERS

    @property
    def keys(self) -> int:
        return WIDE_KEYS[self.head_dim] if self.wide else 64 if self.head_dim == 256 else 128

    @property
    def stages(self) -> int:
        return STAGES[self.head_dim]

    @property
    def q_buffers(self) -> int:
        return 2 if self.head_dim == 64 or (self.head_dim == 128 and not self.wide) else 1

    def describe(self) -> str:
        return f" (Hopper tile, {self.keys} keys)" if self.wide else " (Hopper tile)"


def hopper_smem_bytes(cfg: HopperConfig, elems: ElementBytes) -> int:
    """Alignment slack, query row buffers, K and V stages (of the query dtype: fp8 rows are staged inside
    them), two fp32 scratch rows per warp, two rows of paged key offsets, the K and V stages' and the query
    buffers' full / empty mbarriers, the work item of each query buffer (the producer's hand-on) and the CTA's
    pieces of a tail split."""
    d = cfg.head_dim
    return (1024 + cfg.q_buffers * cfg.rows * d * elems.q + 2 * cfg.stages * cfg.keys * d * elems.q
            + (THREADS // 32) * 2 * d * 4 + 2 * cfg.keys * 8 + 4 * cfg.stages * 8 + 2 * cfg.q_buffers * 8
            + cfg.q_buffers * ITEM_BYTES + TAIL_BYTES)


def hopper_config_for(variant, head_dim: int, kv_scaled: bool = False) -> HopperConfig:
    """The tiling ``variant``'s Hopper kernel runs on calls of ``plan_prefill``'s API (csrc/hopper_tile.cuh
    hopper_wide_tiles, which the kernels follow; a tile-map walk and TVM's slots keep 128 keys): wide where nothing
    checks a score beyond the key range: no mask hook, no key transform, a 16-bit cache (``kv_scaled`` False)."""
    return HopperConfig(head_dim, _widens(variant, head_dim, kv_scaled) and "logits_mask" not in variant.hooks)


def _widens(variant, head_dim: int, kv_scaled: bool) -> bool:
    """What wide tiles need whatever the mask: head dim 64 or 128, no key transform (no per-tile producer work), a
    16-bit cache."""
    return head_dim in WIDE_HEAD_DIMS and not kv_scaled and not row_hooks(variant)[0]


def hopper_wide_for_long_rows(variant, head_dim: int, kv_scaled: bool = False) -> bool:
    """Whether ``variant``'s kernels over long query rows run the wide tiling although its mask hook keeps them
    on 128 keys elsewhere: a mask that is exactly its bounds (causal, sliding window: every score past them is
    skipped by the key range, none checked), no key transform, a 16-bit cache, head dim 64 or 128. The launch takes the
    wide instance where a call's longest request has WIDE_LONG_ROWS (csrc/hopper_tile.cuh kHopperWideRows) query
    rows or more."""
    from attngen.ir.mask_class import mask_needs_map  # (TVM's IR: imported when a build reaches it)

    return _widens(variant, head_dim, kv_scaled) and "logits_mask" in variant.hooks and not mask_needs_map(variant)


def configs(head_dim: int) -> tuple[HopperConfig, ...]:
    return (HopperConfig(head_dim),) + ((HopperConfig(head_dim, wide=True),) if head_dim in WIDE_HEAD_DIMS else ())


def must_fit(query: FitQuery) -> tuple[HopperConfig, ...]:
    return configs(query.head_dim)  # (a variant's kernel takes one of them: every one fits or the build is refused)


def header_section(element_sizes: tuple[int, ...]) -> str:
    rows = [(d, int(c.wide), e, c.rows, c.keys, c.stages, THREADS, hopper_smem_bytes(c, ElementBytes(e, e)))
            for d in HEAD_DIMS for c in configs(d) for e in element_sizes]
    return (cxx_constant("int", "kHopperWideRows", WIDE_LONG_ROWS, "prefill_hopper: kHopperWideRows") + "\n"
            + cxx_table("PrefillHopper", "prefill_hopper: HopperTile<D, Wide> and hopper_prefill_smem_bytes, per "
                        "element size", (("int", "head_dim"), ("int", "wide"), ("int", "elem_bytes"), ("int", "rows"),
                                         ("int", "keys"), ("int", "stages"), ("int", "threads"),
                                         ("unsigned long long", "smem_bytes")), rows))

PREFILL_HOPPER = TemplateRecord(
    name="prefill_hopper",
    role="batch prefill / append on sm_90a: warp-specialised, wgmma, ragged or paged KV",
    needs=ArchNeeds(wgmma=True),
    head_dims=HEAD_DIMS,
    configs=configs,
    smem_bytes=hopper_smem_bytes,
    must_fit=must_fit,
    header_section=header_section,
)
