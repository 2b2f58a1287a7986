// The tensor-core decode's tile (decode_tc.cuh): its shape, default stage counts and shared-memory layout,
// which the host reads too (decode_launch.cuh picks the stages; tile_checks.h checks the schedule's record).
#pragma once
#include <stddef.h>

namespace attngen {

// Tile configuration: S stages of 64 keys (4 warps x 16).
template <int D, int S>
struct DecodeTCTile {
  static_assert(D == 64 || D == 128 || D == 256, "decode supports head_dim 64, 128, 256");
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kKeysPerWarp = 16;
  static constexpr int kKeys = kWarps * kKeysPerWarp;
  static constexpr int kStages = S;
  static constexpr int kMaxGroup = 8;  // rows of the 16-row tile that hold query heads
  static constexpr int kStride = D + 8;  // query rows: padded
};

// Default stage counts (the launcher falls back to fewer where shared memory is short; the decode_tc record's
// STAGES / FP8_STAGES): two CTAs per SM at every head dim on the H200. At D 64 and 128 each CTA loads S - 1 tiles
// ahead across its work items; at D 256 one stage each, the SM's second CTA loading while the first computes (with
// two stages, one CTA per SM: 566 against 490 us at B 64, L 4k; ab_trees_2026-12-03_decode_d256.md). An fp8
// cache's stages are half as large: 7 and 3 of them keep the bytes in flight of 4 and 2 16-bit stages at D 64 and
// 128; at D 256 one fp8 stage (97 KB with the merge region) leaves two CTAs per SM, as for 16-bit caches (three
// stages, one CTA: 2631 against 3750 GB/s at B 32, L 8k; fp8_decode_2026-12-04_d256_ab.md).
template <int D, bool kFp8 = false>
constexpr int decode_tc_stages() {
  if constexpr (kFp8) return D == 64 ? 7 : D == 128 ? 3 : 1;
  return D == 64 ? 4 : D == 128 ? 2 : 1;
}

// Where the warps' merge lies: a 16-bit cache at D 256 merges an item's warps in the stage the loader fills next
// (free from the end of the item's last tile until the next item's first; warp w's accumulator rows over its own
// key rows, which only it reads, the merged rows over the values) and stages its query tiles as 8 rows (the MMA
// tile's rows 8-15 are padding, read from rows 0-7 and masked): without the 49 KB merge region and half the query
// rows, two CTAs fit an SM. Elsewhere the merge region has its own space, so the next item's tiles stay in flight
// during an item's epilogue (an fp8 cache also widens its rows there).
template <int D, bool kFp8>
constexpr bool decode_tc_merge_in_stage() {
  return !kFp8 && D == 256;
}

template <int D, bool kFp8>
constexpr int decode_tc_query_rows() {
  return decode_tc_merge_in_stage<D, kFp8>() ? 8 : 16;
}

// KV-head pairs: where a K/V row is 128 bytes or shorter (an fp8 cache at D 64 / 128, a 16-bit one at D 64), a CTA
// may serve two KV heads, 2y and 2y + 1 (DecodeProblem::kv_head_shift = 1): warps 0-1 take the first head's keys,
// warps 2-3 the second's, a stage holds 32 keys of each, and the query tile holds both heads' groups (2 x group <=
// kMaxGroup rows). In an NHD cache the two heads' rows of a token are adjacent, so the CTA's copies of a token
// read one run of twice the row's bytes where two CTAs would each read a short run of their own at other times.
template <int D, bool kFp8>
constexpr bool decode_tc_pairs_kv_heads() {
  return D * (kFp8 ? 1 : 2) <= 128;
}

// Group parts: a GQA group of more than kMaxGroup query heads (Llama-3-405B's 16, a multi-query model's whole
// head count) runs on ceil(group / kMaxGroup) CTA rows per KV head (DecodeProblem::group_parts), row part p serving
// query heads [8 p, 8 p + 8) of the group; each reads the KV head's rows (the parts of one chunk run side by side,
// so the second read mostly hits L2).
inline int decode_tc_group_parts(int group) {
  constexpr int kRows = DecodeTCTile<64, 1>::kMaxGroup;
  return group > kRows ? (group + kRows - 1) / kRows : 1;
}

// Shared memory: S query tiles (one per work item in flight), per-warp scratch rows, the warps' softmax states
// and row log-sum-exps, the merge region's rows unless they lie in a stage (decode_tc_merge_in_stage), then the
// K/V stages, which start on a 128-byte boundary (see kv_tile_at).
template <int D, int S, bool kFp8 = false>
constexpr size_t decode_tc_tiles_offset() {
  using Tile = DecodeTCTile<D, S>;
  const size_t q = size_t(S) * decode_tc_query_rows<D, kFp8>() * Tile::kStride * 2;
  const size_t scratch = size_t(Tile::kWarps) * 2 * D * sizeof(float);
  const size_t states = (size_t(Tile::kWarps) * Tile::kMaxGroup * 2 + Tile::kMaxGroup) * sizeof(float);
  const size_t rows =
      decode_tc_merge_in_stage<D, kFp8>() ? 0 : (size_t(Tile::kWarps) + 2) * Tile::kMaxGroup * D * sizeof(float);
  return (q + scratch + states + rows + 127) / 128 * 128;
}

// kFp8: an fp8 cache: the S stages of fp8 rows (one byte per element); the 16-bit tile its warps widen
// rows into is the merge region's per-warp accumulator rows (decode_tc.cuh: warp w's 16 rows of D 16-bit
// elements are exactly its [kMaxGroup][D] floats, which it writes only after its last tile)
template <int D, int S, bool kFp8 = false>
constexpr size_t decode_tc_smem_bytes() {
  constexpr size_t kTile = size_t(DecodeTCTile<D, S>::kKeys) * D;
  return decode_tc_tiles_offset<D, S, kFp8>() + (kFp8 ? size_t(S) * 2 * kTile : size_t(S) * 2 * kTile * 2);
}

}  // namespace attngen
