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

// One CTA per (query tile, head row, request); its threads share each key tile's pairs and vote. D (the
// traits' head dim) names the kernel in a linked cubin's table: tile_map_kernel<128>.
template <class V, int D = V::kHeadDim>
__global__ void tile_map_kernel(TileMapProblem M, typename V::Params hp) {
  const int tile = blockIdx.x, hm = blockIdx.y, b = blockIdx.z;
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
  const int n_rows = r_last - r_first + 1;
  const int hk = per_token ? 0 : hm;
  const long long last_pos = pos_base + last_row / M.group;
  for (int k = 0; k < M.k_tiles; ++k) {
    const int j0 = k * M.keys;
    bool any = false, all = true;
    if (j0 >= kv_len || (M.causal && j0 > last_pos)) {
      all = false;  // no key of the tile is visible to any row
    } else {
      for (int p = threadIdx.x; p < n_rows * M.keys; p += blockDim.x) {
        const int r = r_first + p / M.keys, j = j0 + p % M.keys;
        const int tok = per_token ? r : r / M.group;
        const int qh = hk * M.group + (per_token ? 0 : r % M.group);
        const int pos = pos_base + tok;
        bool visible = j < kv_len && (!M.causal || j <= pos);
        if constexpr (V::kHasMask) {
          if (visible) visible = V::mask(hp, b, pos, j, qh, hk);
        }
        any |= visible;
        all &= visible;
      }
    }
    any = __syncthreads_or(any);
    all = __syncthreads_and(all);
    if (threadIdx.x == 0) out[k] = all ? kTileFull : (any ? kTilePartial : kTileEmpty);
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
