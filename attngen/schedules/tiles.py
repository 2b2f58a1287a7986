"""Tile configurations of the CUDA templates and the shared memory each needs (mirrors the
``*_smem_bytes`` functions in attngen/csrc), so that a build refuses an arch whose per-block
shared memory cannot hold a configuration instead of failing at launch.

decode (decode.cuh, DecodeTile): threads = (D/8 lanes) x G heads x Z token lanes (~128),
  tiles of 32 tokens (16 at D=256), 3 cp.async stages of K and V, plus fp32 key rows when
  the variant transforms keys.
decode on tensor cores (decode_tc.cuh, DecodeTCTile): 4 warps x 16 keys per stage, a 16-row
  query tile, S stages (4 / 2 / 2 at D = 64 / 128 / 256, two CTAs per SM at D <= 128; fewer where
  shared memory is short, and the CUDA-core template where even one stage does not fit), rows
  padded by 8 elements, the cross-warp merge region apart from the stages.
prefill (prefill.cuh, PrefillTile): 64 query rows (4 warps x 16; 128 rows, 4 warps x two 16-row
  m-tiles, for long requests at D <= 128 where shared memory holds it), 64 keys per tile (32 at
  D=256, 16 in the small config), 2 stages (1 in the small config except D=64), query rows padded by 8
  elements and K/V rows unpadded with swizzled chunks (both conflict-free for ldmatrix; the K/V tiles
  128-byte aligned); the epilogue stages the tile's fp32 output rows.
"""
from __future__ import annotations

ELEM = 2  # bytes of fp16 / bf16


def decode_smem_bytes(d: int, g: int, key_transform: bool) -> int:
    lanes = d // 8
    z = 1 if lanes * g >= 128 else 128 // (lanes * g)
    tokens, stages = (16 if d == 256 else 32), 3
    tiles = stages * 2 * tokens * d * ELEM
    keys = 2 * tokens * d * 4 if key_transform else 0
    merge = (z * g * (d + 2) + 2 * g * d + g) * 4
    qrows = 2 * g * d * 4
    return max(tiles + keys, merge, qrows)


def decode_tc_smem_bytes(d: int, stages: int) -> int:
    warps, keys, max_group, stride = 4, 64, 8, d + 8
    q = stages * 16 * stride * ELEM  # one query tile per work item in flight
    scratch = warps * 2 * d * 4
    tiles = stages * 2 * keys * d * ELEM  # K/V rows unpadded (swizzled chunks)
    merge = (warps * max_group * (d + 2) + 2 * max_group * d + max_group) * 4
    # the merge region has its own space (tiles stream across items); the tiles start 128-byte aligned
    return -(-(q + scratch + merge) // 128) * 128 + tiles


def prefill_smem_bytes(d: int, small: bool, m_tiles: int = 1) -> int:
    warps = 4
    rows = 16 * m_tiles * warps
    keys = (16 if small else 32) if d == 256 else 64
    stages = 1 if (small and d != 64) else 2
    stride = d + 8
    qk = (rows * stride + 2 * stages * keys * d) * ELEM  # query rows padded, K/V rows unpadded (swizzled)
    out = rows * d * 4 + rows * 4
    return max(qk, out) + warps * 2 * d * 4


def check_fits(arch, kernels, head_dims, group_tiles, key_transform: bool) -> list[str]:
    """Messages for every (template, head_dim) the arch's shared memory cannot hold."""
    problems = []
    for d in head_dims:
        if "decode" in kernels:
            for g in group_tiles:
                need = decode_smem_bytes(d, g, key_transform)
                if need > arch.smem_per_block:
                    problems.append(f"decode head_dim {d} (group tile {g}{', key transform' if key_transform else ''}) "
                                    f"needs {need} B of shared memory, {arch.name} has {arch.smem_per_block} B")
        if "prefill" in kernels and prefill_smem_bytes(d, True) > arch.smem_per_block:
            problems.append(f"prefill head_dim {d} needs {prefill_smem_bytes(d, True)} B of shared memory, "
                            f"{arch.name} has {arch.smem_per_block} B")
    return problems
