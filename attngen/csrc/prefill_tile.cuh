// Tile configurations of the FA2-class prefill template (prefill.cuh) and its shared memory, which the host reads
// too (prefill_launch.cuh picks the configuration; tile_checks.h checks the schedule's record,
// schedules/template_prefill.py).
#pragma once
#include <stddef.h>

#include "kv_staging.cuh"

namespace attngen {

// Tile configurations: Q rows per CTA (4 warps x MT m-tiles of 16 rows), keys per tile, stages
// (1 = no double buffer). MT = 2 (128 rows) halves the K/V traffic from memory and from shared
// memory per FLOP of long prefills; MT = 1 serves short ones and D = 256.
template <int D, bool Small, int MT = 1>
struct PrefillTile {
  static_assert(D == 64 || D == 128 || D == 256, "prefill supports head_dim 64, 128, 256");
  static_assert(MT == 1 || (MT == 2 && D <= 128), "two m-tiles per warp only at head_dim <= 128");
  static constexpr int kWarps = 4;
  static constexpr int kMTiles = MT;
  static constexpr int kRows = 16 * MT * kWarps;
  static constexpr int kKeys = D == 256 ? (Small ? 16 : 32) : 64;
  static constexpr int kStages = (Small && D != 64) ? 1 : 2;
  static constexpr int kPad = 8;  // elements of padding per query row: conflict-free ldmatrix
  static constexpr int kStride = D + kPad;  // query rows; K/V rows are unpadded and swizzled (kv_tile_layout.cuh)
  static constexpr int kThreads = 32 * kWarps;
};

// Staged K/V (kv_staged): one 16-bit K/V tile whatever kStages says, then the staging area of one tile.
template <class V, class T, int D, bool Small, int MT = 1, class KV = T>
constexpr size_t prefill_smem_bytes() {
  using Tile = PrefillTile<D, Small, MT>;
  // the K/V tiles follow the query rows on a 128-byte boundary (RQ * kStride elements are a multiple of 128 bytes)
  size_t qk = (size_t(Tile::kRows) * Tile::kStride + 2 * Tile::kStages * Tile::kKeys * D) * sizeof(T);
  if constexpr (kv_staged<T, KV>())
    qk = (size_t(Tile::kRows) * Tile::kStride + 2 * Tile::kKeys * D) * sizeof(T) +
         size_t(2) * Tile::kKeys * D * sizeof(KV);
  size_t scratch = size_t(Tile::kWarps) * 2 * D * sizeof(float);
  size_t out = size_t(Tile::kRows) * D * sizeof(float) + Tile::kRows * sizeof(float);
  return (qk > out ? qk : out) + scratch;
}

}  // namespace attngen
