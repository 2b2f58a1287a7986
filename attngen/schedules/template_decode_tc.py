"""The tensor-core decode template (csrc/decode_tc.cuh; csrc/decode_tc_tile.cuh: DecodeTCTile<D, S>, decode_tc_stages,
decode_tc_smem_bytes) and the launcher's stage fallback (csrc/decode_launch.cuh try_launch_decode_tc).

Four warps x 16 keys per stage (64 keys), the query heads of a KV head's group as the rows of one 16-row
MMA tile (at most 8 heads), S stages of K/V streamed across a CTA's work items with one query tile per
item in flight, query rows padded by 8 elements (conflict-free ldmatrix), K/V rows unpadded with swizzled
chunks starting 128-byte aligned, per-warp fp32 scratch rows and a cross-warp merge region of its own.
The runtime's split-KV planner reads the same table (attngen/runtime/decode_plan.py) to count the CTAs
the launcher's choice leaves resident per SM.
"""
from __future__ import annotations

from dataclasses import dataclass

from .cxx_tables import cxx_table
from .dtypes import FP8_BYTES, ElementBytes
from .templates import ArchNeeds, FitQuery, TemplateRecord

HEAD_DIMS = (64, 128, 256)
WARPS = 4
KEYS_PER_WARP = 16
KEYS = WARPS * KEYS_PER_WARP  # keys per stage
QUERY_ROWS = 16  # the MMA tile's rows
MAX_GROUP = 8  # rows of the 16-row tile that hold query heads
ROW_PAD = 8  # elements of padding per query row
# default stages per head dim (the launcher falls back to fewer where shared memory is short): two CTAs per SM
# on the H200 at every head dim. Four at D 64 and two at D 128 (each CTA loads S - 1 tiles ahead across its work
# items); one at D 256, where the warps merge in a stage and the query tiles hold 8 rows (merge_in_stage), so
# that the SM's second CTA loads while the first computes (two stages, one CTA per SM: 566 against 490 us at
# B 64, L 4k, ab_trees_2026-12-03_decode_d256.md)
STAGES = {64: 4, 128: 2, 256: 1}
# an fp8 cache's stages hold one byte per element and its rows are widened into the merge region's
# accumulator rows (no tile of their own): 2 (S - 1) + 1 fp8 stages keep the bytes in flight of S = 4 and 2
# 16-bit stages with a merge region of their own at D 64 and 128 (H200: two CTAs per SM); at D 256 one stage
# leaves two CTAs per SM where three left one (B 32 L 8k 3750 against 2631 GB/s, FlashInfer's fp8 2981:
# fp8_decode_2026-12-04_d256_ab.md), the SM's second CTA loading while the first computes. Three
# CTAs per SM (five stages at D 64, two at D 128, registers bounded to 168) were faster where each CTA streams
# one long item (B 16 L 16k 3834 against 3456 GB/s, B 1 L 64k 2724 / 2315, MHA 3817 / 3686) and slower where
# plans pack several items per CTA (B 64 L 4k 2513 / 3567, D 64 1988 / 2571): fp8_decode_2026-12-02_occupancy.md
# / _twocta.md
FP8_STAGES = {64: 7, 128: 3, 256: 1}


@dataclass(frozen=True)
class DecodeTCConfig:
    head_dim: int
    stages: int

    @property
    def keys(self) -> int:
        return KEYS

    @property
    def stride(self) -> int:  # elements per padded query row
        return self.head_dim + ROW_PAD

    def describe(self) -> str:
        return f" ({self.stages} stages)"


def merge_in_stage(head_dim: int, kv_bytes: int) -> bool:
    """Whether the warps merge in the stage the loader fills next, with 8-row query tiles (a 16-bit cache at
    D 256: csrc/decode_tc_tile.cuh decode_tc_merge_in_stage); elsewhere the merge region has its own space."""
    return kv_bytes != FP8_BYTES and head_dim == 256


def pairs_kv_heads(head_dim: int, kv_bytes: int) -> bool:
    """Whether a CTA may serve two KV heads (``kv_heads_per_cta=2``: csrc/decode_tc_tile.cuh
    decode_tc_pairs_kv_heads): rows of at most 128 bytes, an fp8 cache at D 64 / 128 or a 16-bit one at D 64. In
    an NHD cache the pair's rows of a token are adjacent, so its copies read one run of twice a row's bytes."""
    return head_dim * kv_bytes <= 128


def decode_tc_tiles_offset(cfg: DecodeTCConfig, elems: ElementBytes) -> int:
    """Bytes before the K/V stages: a query tile per stage, the scratch rows, the warps' softmax states and row
    log-sum-exps, and the merge region's rows unless they lie in a stage."""
    d = cfg.head_dim
    in_stage = merge_in_stage(d, elems.kv)
    q = cfg.stages * (MAX_GROUP if in_stage else QUERY_ROWS) * cfg.stride * elems.q
    scratch = WARPS * 2 * d * 4
    states = (WARPS * MAX_GROUP * 2 + MAX_GROUP) * 4
    rows = 0 if in_stage else (WARPS + 2) * MAX_GROUP * d * 4
    return -(-(q + scratch + states + rows) // 128) * 128


def decode_tc_smem_bytes(cfg: DecodeTCConfig, elems: ElementBytes) -> int:
    """The whole block: the K/V stages after the offset (an fp8 cache widens its rows into the merge
    region, no tile of its own)."""
    tile = KEYS * cfg.head_dim
    return decode_tc_tiles_offset(cfg, elems) + cfg.stages * 2 * tile * elems.kv


def stage_order(stages: int) -> list[int]:
    """The stage counts the launcher tries, deepest first: the default, then 2, then 1 (none deeper than the
    default)."""
    return [s for s in dict.fromkeys((stages, 2, 1)) if s <= stages]


def configs(head_dim: int, kv_bytes: int = 2) -> tuple[DecodeTCConfig, ...]:
    """The configurations the launcher tries for ``head_dim`` over a cache of ``kv_bytes`` per element, in
    its order."""
    table = FP8_STAGES if kv_bytes == FP8_BYTES else STAGES
    return tuple(DecodeTCConfig(head_dim, s) for s in stage_order(table[head_dim]))


def must_fit(query: FitQuery) -> tuple:
    return ()  # where no tensor-core tile fits, the decode entry runs the CUDA-core template


def header_section(element_sizes: tuple[int, ...]) -> str:
    stages = cxx_table("DecodeTCStages", "decode_tc (tensor cores): decode_tc_stages<D, kFp8>(), the default stage "
                       "count per K/V element size, and decode_tc_pairs_kv_heads<D, kFp8>()",
                       (("int", "head_dim"), ("int", "kv_bytes"), ("int", "stages"), ("int", "pairs_kv_heads")),
                       [(d, kv, configs(d, kv)[0].stages, int(pairs_kv_heads(d, kv))) for d in HEAD_DIMS
                        for kv in (2, FP8_BYTES)])
    sizes = [(e, e) for e in element_sizes if e == 2] + [(2, FP8_BYTES)]
    rows = [(c.head_dim, c.stages, e, kv, c.keys, decode_tc_smem_bytes(c, ElementBytes(e, kv)))
            for d in HEAD_DIMS for e, kv in sizes for c in configs(d, kv)]
    tiles = cxx_table("DecodeTC", "decode_tc: DecodeTCTile<D, S> and decode_tc_smem_bytes<D, S, kFp8>() of every "
                      "stage count the launcher tries, per query and K/V element size",
                      (("int", "head_dim"), ("int", "stages"), ("int", "elem_bytes"), ("int", "kv_bytes"),
                       ("int", "keys"), ("unsigned long long", "smem_bytes")), rows)
    return stages + "\n" + tiles


DECODE_TC = TemplateRecord(
    name="decode_tc",
    role="batch decode over paged KV on tensor cores (mma.sync), split-KV plans and the fused merge",
    needs=ArchNeeds(mma=("m16n8k16", "m16n8k8")),
    head_dims=HEAD_DIMS,
    configs=configs,
    smem_bytes=decode_tc_smem_bytes,
    must_fit=must_fit,
    header_section=header_section,
    headers=("decode_tc.cuh",),
)
