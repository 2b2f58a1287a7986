"""The CUDA-core decode template (csrc/decode.cuh: DecodeTile<D, G>, decode_smem_bytes).

One CTA = (KV chunk, KV head, request). A K/V row of D elements is spread over D / 8 lanes (one 16-byte
vector each), G query heads of the KV head's group share every K/V tile, and Z token lanes split a tile's
tokens so that a CTA has about 128 threads. Tiles of T tokens are gathered by cp.async, S stages deep;
a variant that transforms keys keeps fp32 copies of the tile's key rows. The decode entry launches the
tensor-core template first (``decode_tc``) and this one where no tensor-core tile fits or where asked to.
"""
from __future__ import annotations

from dataclasses import dataclass

from .cxx_tables import cxx_table
from .dtypes import ElementBytes
from .templates import ArchNeeds, FitQuery, TemplateRecord

HEAD_DIMS = (64, 128, 256)
# query heads per CTA: the powers of two up to the largest GQA group a build serves (max_group_size)
GROUP_TILES = (1, 2, 4, 8)
THREADS = 128  # target threads per CTA: Z token lanes fill a group tile up to it
# tokens per stage: a stage of K or V is 32 x D elements (4 / 8 KiB at D 64 / 128 in 16-bit types); at
# D 256, 16 tokens keep a stage at the D 128 size, so three stages of K and V take 48 KiB there too
TOKENS = {64: 32, 128: 32, 256: 16}
STAGES = 3  # cp.async stages of K and V: loads of two tiles in flight while one is computed


@dataclass(frozen=True)
class DecodeConfig:
    head_dim: int
    group: int  # G: query heads per CTA
    key_transform: bool = False  # fp32 key rows for the variant's key transform

    @property
    def lanes(self) -> int:
        return self.head_dim // 8

    @property
    def token_lanes(self) -> int:  # Z
        per_token = self.lanes * self.group
        return 1 if per_token >= THREADS else THREADS // per_token

    @property
    def threads(self) -> int:
        return self.lanes * self.group * self.token_lanes

    @property
    def tokens(self) -> int:
        return TOKENS[self.head_dim]

    @property
    def stages(self) -> int:
        return STAGES

    def describe(self) -> str:
        return f" (group tile {self.group}{', key transform' if self.key_transform else ''})"


def decode_smem_bytes(cfg: DecodeConfig, elems: ElementBytes) -> int:
    """The K/V stages (plus fp32 key rows), or the cross-lane merge, or the fp32 query rows: the largest,
    as the three share the buffer."""
    d, g = cfg.head_dim, cfg.group
    tiles = cfg.stages * 2 * cfg.tokens * d * elems.kv
    keys = 2 * cfg.tokens * d * 4 if cfg.key_transform else 0
    merge = (cfg.token_lanes * g * (d + 2) + 2 * g * d + g) * 4
    qrows = 2 * g * d * 4
    return max(tiles + keys, merge, qrows)


def configs(head_dim: int) -> tuple[DecodeConfig, ...]:
    return tuple(DecodeConfig(head_dim, g, k) for g in GROUP_TILES for k in (False, True))


def must_fit(query: FitQuery) -> tuple[DecodeConfig, ...]:
    """Every group tile up to the build's largest group: the launcher picks one by the call's group."""
    return tuple(DecodeConfig(query.head_dim, g, query.key_transform) for g in GROUP_TILES if g <= query.max_group)


def header_section(element_sizes: tuple[int, ...]) -> str:
    rows = [(c.head_dim, c.group, c.key_transform, e, c.tokens, c.stages, c.threads,
             decode_smem_bytes(c, ElementBytes(e, e)))
            for d in HEAD_DIMS for c in configs(d) for e in element_sizes]
    return cxx_table("Decode", "decode (CUDA cores): DecodeTile<D, G> and decode_smem_bytes, per element size",
                     (("int", "head_dim"), ("int", "group"), ("bool", "key_transform"), ("int", "elem_bytes"),
                      ("int", "tokens"), ("int", "stages"), ("int", "threads"), ("unsigned long long", "smem_bytes")),
                     rows)


DECODE = TemplateRecord(
    name="decode",
    role="batch decode over paged KV on CUDA cores (the tensor-core template first where a tile fits)",
    needs=ArchNeeds(),  # CUDA cores; cp.async where the arch has it, synchronous copies before sm_80
    head_dims=HEAD_DIMS,
    configs=configs,
    smem_bytes=decode_smem_bytes,
    must_fit=must_fit,
    header_section=header_section,
    headers=("entry_decode.h",),
    exports=("batch_decode_paged_{layout}",),
    emitter="decode_entries",
    requires=("decode_tc",),
)
