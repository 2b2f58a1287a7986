"""The FA2-class prefill / append template (csrc/prefill_tile.cuh: PrefillTile<D, Small, MT>, prefill_smem_bytes;
csrc/prefill_launch.cuh: kPrefillWideRows, launch_prefill's choice).

Four warps, each owning MT m-tiles of 16 query rows (the rows are the (token, head) pairs of a KV head's
group); K/V tiles gathered by cp.async, double-buffered where shared memory allows; query rows padded by
8 elements, K/V rows unpadded with swizzled chunks (both conflict-free for ldmatrix; the K/V tiles start
128-byte aligned); the epilogue stages the tile's fp32 output rows in the same buffer; per-warp fp32
scratch rows for row hooks. The launcher's configurations, in its order:

- wide: 128 rows (MT = 2), 64 keys, 2 stages, at D <= 128 for requests of at least ``WIDE_ROWS`` rows
  where shared memory holds it (H200 causal prefill at L 4k / 16k: 1.30x / 1.31x the 64-row tile);
- big: 64 rows, 64 keys (32 at D 256), 2 stages, where shared memory holds it;
- small: 64 rows, 64 keys (16 at D 256), 1 stage (2 at D 64): the last resort, which must fit.

K/V narrower than the query (fp8 caches) are staged: each configuration holds one 16-bit K/V tile, whatever
its stage count, plus a staging area of one tile in the cache's bytes, into which the next tile is copied
while this one is computed (csrc/kv_staging.cuh). That is less than two 16-bit stages, so on sm_86 / sm_89
(99 KB per block) an fp8 cache gets the wide tile at D 128 and the big one at D 256, which a 16-bit one does not;
the small configuration (one stage) grows by the staging tile.
"""
from __future__ import annotations

from dataclasses import dataclass

from .cxx_tables import cxx_constant, cxx_table
from .dtypes import FP8_BYTES, ElementBytes
from .templates import ArchNeeds, FitQuery, TemplateRecord

HEAD_DIMS = (64, 128, 256)
WARPS = 4
ROW_PAD = 8  # elements of padding per query row
WIDE_ROWS = 256  # rows (tokens x group heads) of the longest request from which the wide tile is used
WIDE_MAX_HEAD_DIM = 128  # two m-tiles' output accumulators are D fp32 registers per thread (255 at most)


@dataclass(frozen=True)
class PrefillConfig:
    head_dim: int
    small: bool  # the configuration that fits the least shared memory
    m_tiles: int = 1  # 16-row MMA tiles per warp

    @property
    def rows(self) -> int:
        return 16 * self.m_tiles * WARPS

    @property
    def keys(self) -> int:  # keys per tile: 64; at D 256 32 (16 in the small configuration)
        if self.head_dim == 256:
            return 16 if self.small else 32
        return 64

    @property
    def stages(self) -> int:  # the small configuration drops the double buffer except at D 64
        return 1 if (self.small and self.head_dim != 64) else 2

    @property
    def stride(self) -> int:
        return self.head_dim + ROW_PAD

    def describe(self) -> str:
        return ""


def kv_bytes(cfg: PrefillConfig, elems: ElementBytes) -> int:
    """Shared memory of the K/V tiles: ``stages`` 16-bit K and V tiles, or for staged K/V (narrower than the
    query) one 16-bit tile and one staging tile in the cache's element size."""
    tile = 2 * cfg.keys * cfg.head_dim
    if elems.kv < elems.q:
        return tile * (elems.q + elems.kv)
    return cfg.stages * tile * elems.kv


def prefill_smem_bytes(cfg: PrefillConfig, elems: ElementBytes) -> int:
    """Query rows and K/V tiles, or the fp32 output rows of the epilogue (they share the buffer), plus
    the scratch rows."""
    d = cfg.head_dim
    qk = cfg.rows * cfg.stride * elems.q + kv_bytes(cfg, elems)
    out = cfg.rows * d * 4 + cfg.rows * 4
    return max(qk, out) + WARPS * 2 * d * 4


def configs(head_dim: int) -> tuple[PrefillConfig, ...]:
    wide = (PrefillConfig(head_dim, False, 2),) if head_dim <= WIDE_MAX_HEAD_DIM else ()
    return wide + (PrefillConfig(head_dim, False), PrefillConfig(head_dim, True))


def must_fit(query: FitQuery) -> tuple[PrefillConfig, ...]:
    return (PrefillConfig(query.head_dim, True),)


def header_section(element_sizes: tuple[int, ...]) -> str:
    """Rows per configuration and (query, K/V) element sizes: K/V in the query's size, and staged fp8 K/V."""
    sizes = [(e, e) for e in element_sizes] + [(e, FP8_BYTES) for e in element_sizes if e > FP8_BYTES]
    rows = [(c.head_dim, c.small, c.m_tiles, e, kv, c.rows, c.keys, c.stages,
             prefill_smem_bytes(c, ElementBytes(e, kv))) for d in HEAD_DIMS for c in configs(d) for e, kv in sizes]
    return (cxx_constant("int", "kPrefillWideRows", WIDE_ROWS, "prefill: kPrefillWideRows") + "\n"
            + cxx_table("Prefill", "prefill: PrefillTile<D, Small, MT> and prefill_smem_bytes, per query and K/V "
                        "element size", (("int", "head_dim"), ("bool", "small"), ("int", "m_tiles"),
                                         ("int", "elem_bytes"), ("int", "kv_bytes"), ("int", "rows"), ("int", "keys"),
                                         ("int", "stages"), ("unsigned long long", "smem_bytes")), rows))


PREFILL = TemplateRecord(
    name="prefill",
    role="batch prefill / append on tensor cores (mma.sync), ragged or paged KV",
    needs=ArchNeeds(mma=("m16n8k16", "m16n8k8")),  # m16n8k16, or two m16n8k8 on sm_75
    head_dims=HEAD_DIMS,
    configs=configs,
    smem_bytes=prefill_smem_bytes,
    must_fit=must_fit,
    header_section=header_section,
    headers=("entry_prefill.h",),
    # and the classifier of mask-derived tile maps (csrc/tile_map.cuh), whose maps both templates walk
    exports=("batch_prefill_ragged", "batch_prefill_paged_{layout}", "prefill_tile_map"),
    emitter="prefill_entries",
    companions=("prefill_hopper",),  # csrc/prefill_dispatch.h picks it on compute capability 9.0
)
