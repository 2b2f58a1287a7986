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

// Default stage counts (the launcher falls back to fewer where shared memory is short): two CTAs
// per SM at D 64 and 128 (each loads S - 1 tiles ahead across its work items), one at D 256. An fp8
// cache's stages are half as large: 2 (S16 - 1) + 1 of them keep as many bytes in flight as S16 16-bit
// stages, at the same CTAs per SM.
template <int D, bool kFp8 = false>
constexpr int decode_tc_stages() {
  constexpr int kStages16 = D == 64 ? 4 : 2;
  return kFp8 ? 2 * (kStages16 - 1) + 1 : kStages16;
}

// Shared memory: S query tiles (one per work item in flight), per-warp scratch rows, the
// cross-warp merge region, then the K/V stages. The merge region has its own space so the next
// work item's tiles can be in flight while this item's epilogue runs.
// The K/V stages start on a 128-byte boundary (see kv_tile_at).
template <int D, int S>
constexpr size_t decode_tc_tiles_offset() {
  using Tile = DecodeTCTile<D, S>;
  const size_t q = size_t(S) * 16 * Tile::kStride * 2;
  const size_t scratch = size_t(Tile::kWarps) * 2 * D * sizeof(float);
  const size_t merge = (size_t(Tile::kWarps) * Tile::kMaxGroup * (D + 2) + 2 * size_t(Tile::kMaxGroup) * D +
                        Tile::kMaxGroup) * sizeof(float);
  return (q + scratch + merge + 127) / 128 * 128;
}

// kFp8: an fp8 cache: the S stages of fp8 rows (one byte per element); the 16-bit tile its warps widen
// rows into is the merge region's per-warp accumulator rows (decode_tc.cuh: warp w's 16 rows of D 16-bit
// elements are exactly its [kMaxGroup][D] floats, which it writes only after its last tile)
template <int D, int S, bool kFp8 = false>
constexpr size_t decode_tc_smem_bytes() {
  constexpr size_t kTile = size_t(DecodeTCTile<D, S>::kKeys) * D;
  return decode_tc_tiles_offset<D, S>() + (kFp8 ? size_t(S) * 2 * kTile : size_t(S) * 2 * kTile * 2);
}

}  // namespace attngen
