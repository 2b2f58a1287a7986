// Mask-derived tile maps: which (query tile, key tile) pairs of the prefill templates' tiling a mask hook
// leaves empty, partial or full, computed on the device from the hook itself (no user-written block mask).
//
// A prefill CTA's query tile is `rows` packed (token, head) rows of one KV head's group (row = token *
// group + head, as the templates pack them); key tile k holds keys [k * keys, (k + 1) * keys). A pair is
// visible when its key lies below the request's KV length, before or at the query's position under the
// run-time causal flag, and the variant's mask hook admits it. A tile is empty when no pair of its existing
// rows is visible, full when every pair of its existing rows with each of its `keys` keys is (so a full
// tile's keys all exist, and the templates may run it without the mask hook or any check), else partial.
// Rows past the request's end are no pair's: the templates compute them and store nothing.
//
// A mask that reads no head index (V::kMaskReadsHeads false) gets one map for every KV head (heads = 1),
// evaluated per token: a query tile's rows then cover tokens row0 / group .. last_row / group. Else each KV
// head has its own, evaluated per packed row (every query head of the group), also when there is one KV head.
//
// The plan (runtime/tile_map.py) compacts the map into per-row lists of the non-empty key tiles, each
// entry key_tile * 2 + full, which the templates walk instead of their key range (TileList).
#pragma once
#include <stdint.h>

#include <string>

#include "common.cuh"
#include "cubin_launch.h"
#include "hook_abi.h"

namespace attngen {

enum TileClass : uint8_t { kTileEmpty = 0, kTilePartial = 1, kTileFull = 2 };

// The maps' tiling: the Hopper template's tile (hopper_prefill.cuh asserts it). The mma.sync template's
// tiles (64 or 128 rows, 64 / 32 / 16 keys) divide it, so each of its tiles takes the class of the map tile
// it lies in: a part of an empty tile is empty, of a full one full, of a partial one checked.
template <int D>
struct MapTile {
  static constexpr int kRows = 128;
  static constexpr int kKeys = D == 256 ? 64 : 128;
};

// Whether a variant's kernels walk tile maps: a mask the static analysis does not reduce to its bounds.
template <class V>
constexpr bool variant_maps_tiles() {
  return V::kHasMask && !V::kMaskExact;
}

// The non-empty key tiles of every (request, head row, query tile) of a prefill launch; indptr == nullptr
// when the launch has no map (the templates walk their key range).
struct TileList {
  const int32_t* indptr;   // [batch * heads * q_tiles + 1] into entries
  const int32_t* entries;  // key tile index * 2 + 1 if full, ascending within a list
  int heads;               // 1 (one map for every KV head) or the number of KV heads
  int q_tiles;             // query tiles per (request, head row): the launch's grid tiles
  __host__ __device__ bool present() const { return indptr != nullptr; }
  __device__ __forceinline__ int list(int b, int hk, int tile) const {
    return (b * heads + (heads == 1 ? 0 : hk)) * q_tiles + tile;
  }
};

// What the classifier needs of a prefill problem and of the template's tiling.
struct TileMapProblem {
  const int32_t* qo_indptr;  // [B+1]
  const int32_t* kv_len;     // [B]
  uint8_t* map;              // [B, heads, q_tiles, k_tiles] TileClass
  int batch, group, num_kv_heads, causal;
  int rows, keys, q_tiles, k_tiles, heads;
};

// One CTA per (query tile, head row, request). Its threads first compute each of the tile's rows' position,
// query head and mask row terms (the mask hook's row-invariant reads, codegen/mask_split.py) into shared memory;
// then each warp classifies its own key tiles (k = warp, warp + 8, ...): a lane takes kKeys / 32 keys of the tile
// and walks the rows, the warp votes, and stops early once the tile is known partial. No block-wide barrier per
// key tile, and per pair one mask evaluation from the row's terms. D (the traits' head dim) names the kernel in a
// linked cubin's table: tile_map_kernel<128>.
template <class V, int D = V::kHeadDim>
__global__ void __launch_bounds__(256) tile_map_kernel(TileMapProblem M, typename V::Params hp) {
  // the map tile (the entry refuses another: M.rows, M.keys are these)
  constexpr int kMaxRows = MapTile<D>::kRows, kKeys = MapTile<D>::kKeys;
  constexpr int kTerms = V::kMaskRowTerms > 0 ? V::kMaskRowTerms : 1;
  static_assert(kKeys % 32 == 0, "a lane takes whole keys of a tile");
  __shared__ int row_pos[kMaxRows], row_head[kMaxRows];
  __shared__ int row_terms[kMaxRows][kTerms];
  const int tile = blockIdx.x, hm = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint8_t* out = M.map + ((int64_t(b) * M.heads + hm) * M.q_tiles + tile) * M.k_tiles;
  const int q0 = M.qo_indptr[b], qo_len = M.qo_indptr[b + 1] - q0;
  const int rows_total = qo_len * M.group, row0 = tile * M.rows;
  const int kv_len = M.kv_len[b], pos_base = kv_len - qo_len;
  if (row0 >= rows_total) {
    for (int k = threadIdx.x; k < M.k_tiles; k += blockDim.x) out[k] = kTileEmpty;
    return;
  }
  const int last_row = min(row0 + M.rows, rows_total) - 1;
  // the pairs' rows: per token (a head-free mask, head 0 of the group stands for all) or per packed row. The
  // trait decides, not heads == 1: with one KV head a head-reading mask still differs between its query heads
  constexpr bool per_token = !V::kMaskReadsHeads;
  const int r_first = per_token ? row0 / M.group : row0, r_last = per_token ? last_row / M.group : last_row;
  const int n_rows = r_last - r_first + 1;  // <= kMaxRows
  const int hk = per_token ? 0 : hm;
  for (int i = threadIdx.x; i < n_rows; i += blockDim.x) {
    const int r = r_first + i;
    const int tok = per_token ? r : r / M.group;
    row_pos[i] = pos_base + tok;
    row_head[i] = hk * M.group + (per_token ? 0 : r % M.group);
    int rt[kTerms] = {};
    if constexpr (V::kHasMask && V::kMaskRowTerms > 0) V::mask_row_terms(hp, b, row_pos[i], row_head[i], hk, rt);
#pragma unroll
    for (int t = 0; t < kTerms; ++t) row_terms[i][t] = rt[t];
  }
  __syncthreads();
  const long long last_pos = pos_base + last_row / M.group;
  for (int k = warp; k < M.k_tiles; k += blockDim.x / 32) {
    const int j0 = k * kKeys;
    bool any = false, all = true;
    if (j0 >= kv_len || (M.causal && j0 > last_pos)) {
      all = false;  // no key of the tile is visible to any row
    } else {
      for (int r0 = 0; r0 < n_rows; r0 += 8) {
        for (int r = r0; r < min(r0 + 8, n_rows); ++r) {
          const int pos = row_pos[r], qh = row_head[r];
          int rt[kTerms];
#pragma unroll
          for (int t = 0; t < kTerms; ++t) rt[t] = row_terms[r][t];
#pragma unroll
          for (int c = 0; c < kKeys / 32; ++c) {
            const int j = j0 + lane + 32 * c;
            bool visible = j < kv_len && (!M.causal || j <= pos);
            if constexpr (V::kHasMask && V::kMaskTotal) {  // its reads stay in bounds: no test first
              visible = V::mask_from_terms(hp, b, pos, j, qh, hk, rt) && visible;
            } else if constexpr (V::kHasMask) {
              if (visible) visible = V::mask_from_terms(hp, b, pos, j, qh, hk, rt);
            }
            any |= visible;
            all &= visible;
          }
        }
        // a tile with a visible and an invisible pair is partial whatever its other pairs are
        if (__any_sync(0xffffffffu, any) && !__all_sync(0xffffffffu, all)) break;
      }
    }
    any = __any_sync(0xffffffffu, any);
    all = __all_sync(0xffffffffu, all);
    if (lane == 0) out[k] = all ? kTileFull : (any ? kTilePartial : kTileEmpty);
  }
}

// The classifier: the traits' own instance, or in linked builds the one of the cubin (cubin_launch.h).
template <class V>
void launch_tile_map(const TileMapProblem& M, const typename V::Params& hp, cudaStream_t stream) {
  if (M.batch == 0 || M.q_tiles == 0 || M.k_tiles == 0) return;
  using Fn = void (*)(TileMapProblem, typename V::Params);
  Fn kernel;
  if constexpr (linked_hooks<V>()) {
    kernel = linked_kernel_cached<Fn>([] { return "tile_map_kernel<" + std::to_string(V::kHeadDim) + ">"; });
  } else {
    kernel = tile_map_kernel<V>;
  }
  launch_kernel(kernel, dim3(M.q_tiles, M.heads, M.batch), dim3(256), 0, stream, M, hp);
}

}  // namespace attngen
