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
//
// Row key intervals: the classifier also records, per map row (a token of a head-free map, else a packed row),
// whether the keys it sees form one interval [lo, hi] (inclusive; (0, -1) when it sees none or lies past the
// request's end) or not ((-1, -1)). A document mask with causal attention inside each document sees one
// interval per row, and so does a prefix-LM; a bit mask or a striped one need not. A template then runs a
// partial tile of rows that all see intervals with two compares per score instead of the mask hook.
#pragma once
#include <climits>
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
  const int2* row_keys;     // [lists, MapTile<D>::kRows] each map row's key interval (above), by list
  __host__ __device__ bool present() const { return indptr != nullptr; }
  __device__ __forceinline__ int list(int b, int hk, int tile) const {
    return (b * heads + (heads == 1 ? 0 : hk)) * q_tiles + tile;
  }
};

// Where a map's row key intervals start in tile_entries: after the lists' entries, at the end of the tensor
// (runtime/tile_map.py puts them there): `lists * rows` int32 pairs.
__host__ __device__ inline int64_t row_keys_offset(int64_t entries_size, int64_t lists, int rows) {
  return entries_size - 2 * lists * rows;
}

// The plan's tile lists made from a map on the device (tile_lists_kernel; nullptr indptr: not wanted, the plan
// compacts the map itself).
struct TileListsOut {
  int32_t* indptr;      // [lists + 1] each list's first entry
  int32_t* pair_tiles;  // [B * q_tiles] each (request, query tile)'s listed key tiles over its head rows
  int32_t* counts;      // [3] tiles by class: empty, partial, full
  int32_t* entries;     // the lists' room (at least lists * k_tiles): key tile * 2 + 1 if full, list after list
  int32_t* order;       // [B * q_tiles] the pairs by listed tiles, most first, ties in pair order (the Hopper
                        // template's work order, work_order.py); the identity where a pair's listed tiles may
                        // reach kOrderBins (the plan then sorts pair_tiles itself)
};

// The work order's counting sort keeps a count per value of a pair's listed tiles (0 .. heads * k_tiles) in
// shared memory: maps of more key tiles (over their head rows) get the identity (runtime/tile_map.py ORDER_BINS).
constexpr int kOrderBins = 4096;

// What the classifier needs of a prefill problem and of the template's tiling.
struct TileMapProblem {
  const int32_t* qo_indptr;  // [B+1]
  const int32_t* kv_indptr;  // [B+1] the KV view's: token offsets (ragged) or page offsets (paged)
  const int32_t* last_page_len;  // [B] a paged view's (nullptr: ragged)
  int page_size;
  uint8_t* map;              // [B, heads, q_tiles, k_tiles] TileClass
  int2* row_keys;            // [B, heads, q_tiles, rows] each map row's key interval (nullptr: not wanted)
  int batch, group, num_kv_heads, causal;
  int rows, keys, q_tiles, k_tiles, heads;
  TileListsOut lists;
};

// op(x of every lane) over the warp's 32 lanes, on every lane.
template <class Op>
__device__ __forceinline__ int lanes_reduce(int x, Op op) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

__device__ __forceinline__ int lanes_total(int x) {
  return lanes_reduce(x, [](int a, int b) { return a + b; });
}

// Request b's keys, from the view's index arrays (the paged view's as runtime/views.py paged_lengths).
__device__ __forceinline__ int kv_length(const TileMapProblem& M, int b) {
  const int n = M.kv_indptr[b + 1] - M.kv_indptr[b];
  if (M.last_page_len == nullptr) return n;
  return n > 0 ? (n - 1) * M.page_size + M.last_page_len[b] : 0;
}

// Which of keys j0 .. j0 + 31 the row at `pos` (query head qh, mask row terms rt) sees: bit c for key j0 + c.
// A mask whose reads stay in bounds (kMaskTotal) is evaluated for every key, fully unrolled (its reads, one
// address per warp, issue ahead of the compares); another only behind the key's own tests, 4 keys at a time
// (unrolled further, a bit mask's branches spill).
template <class V>
__device__ __forceinline__ unsigned visible_keys(bool causal, const typename V::Params& hp, int b, int pos, int j0,
                                                 int kv_len, int qh, int hk, int* rt) {
  constexpr bool kEager = !V::kHasMask || V::kMaskTotal;
  constexpr int kUnroll = kEager ? 32 : 4;
  unsigned seen = 0u;
#pragma unroll kUnroll
  for (int c = 0; c < 32; ++c) {
    const int j = j0 + c;
    bool visible = j < kv_len && (!causal || j <= pos);
    if constexpr (V::kHasMask && kEager) {
      visible = V::mask_from_terms(hp, b, pos, j, qh, hk, rt) && visible;
    } else if constexpr (V::kHasMask) {
      if (visible) visible = V::mask_from_terms(hp, b, pos, j, qh, hk, rt);
    }
    seen |= visible ? 1u << c : 0u;
  }
  return seen;
}

// One CTA per (query tile, head row, request). Its threads first compute each of the tile's rows' position,
// query head and mask row terms (the mask hook's row-invariant reads, codegen/mask_split.py) into shared memory;
// then each warp classifies its own key tiles (k = warp, warp + 8, ...) with a lane per row: the warp walks a
// tile's keys together, so a key's reads (a document id) are one address for the warp and the rows' terms stay
// in the lanes' registers; the warp's votes classify the tile. No block-wide barrier per key tile, and per pair
// one mask evaluation from the row's terms. Where the plan wants the rows' key intervals, each lane keeps its
// rows' first and last visible key and their count over the warp's tiles, merged once at the end (shared-memory
// atomics: several warps see a row), so a partial tile is walked to its end; without, the warp stops once the
// tile is known partial. A mask with a key term (codegen/mask_split.py: a conjunct rt[i] == a read of the key's
// own, a document id) first has each warp compare the range of its tile's keys' terms with the range of the
// rows' rt[i]: disjoint ranges share no value, so no pair of the tile is visible and its keys are not walked
// (most tiles of packed documents, whose ids grow along the row). D (the traits' head dim) names the kernel in a linked cubin's table:
// tile_map_kernel<128>. (Warp votes only: the classifier builds for sm_75 too.)
template <class V, int D = V::kHeadDim>
__global__ void __launch_bounds__(256) tile_map_kernel(TileMapProblem M, typename V::Params hp) {
  // the map tile (the entry refuses another: M.rows, M.keys are these)
  constexpr int kMaxRows = MapTile<D>::kRows, kKeys = MapTile<D>::kKeys;
  constexpr int kTerms = V::kMaskRowTerms > 0 ? V::kMaskRowTerms : 1;
  static_assert(kKeys % 32 == 0, "a lane takes whole keys of a tile");
  __shared__ int row_pos[kMaxRows], row_head[kMaxRows];
  __shared__ int row_terms[kMaxRows][kTerms];
  __shared__ int row_lo[kMaxRows], row_hi[kMaxRows], row_count[kMaxRows];
  __shared__ int term_lo, term_hi;  // the range of the rows' key-compared term (V::kMaskKeyTerm)
  const int tile = blockIdx.x, hm = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t list = (int64_t(b) * M.heads + hm) * M.q_tiles + tile;
  uint8_t* out = M.map + list * M.k_tiles;
  int2* out_rows = M.row_keys ? M.row_keys + list * kMaxRows : nullptr;
  const bool want_rows = out_rows != nullptr;
  const int q0 = M.qo_indptr[b], qo_len = M.qo_indptr[b + 1] - q0;
  const int rows_total = qo_len * M.group, row0 = tile * M.rows;
  const int kv_len = kv_length(M, b), pos_base = kv_len - qo_len;
  if (row0 >= rows_total) {
    for (int k = threadIdx.x; k < M.k_tiles; k += blockDim.x) out[k] = kTileEmpty;
    if (want_rows)
      for (int i = threadIdx.x; i < kMaxRows; i += blockDim.x) out_rows[i] = make_int2(0, -1);
    return;
  }
  const int last_row = min(row0 + M.rows, rows_total) - 1;
  // the pairs' rows: per token (a head-free mask, head 0 of the group stands for all) or per packed row. The
  // trait decides, not heads == 1: with one KV head a head-reading mask still differs between its query heads
  constexpr bool per_token = !V::kMaskReadsHeads;
  const int r_first = per_token ? row0 / M.group : row0, r_last = per_token ? last_row / M.group : last_row;
  const int n_rows = r_last - r_first + 1;  // <= kMaxRows
  const int hk = per_token ? 0 : hm;
  constexpr int kKeyTerm = V::kHasMask ? V::kMaskKeyTerm : -1;
  if (threadIdx.x == 0) term_lo = INT_MAX, term_hi = INT_MIN;
  __syncthreads();
  for (int i = threadIdx.x; i < kMaxRows; i += blockDim.x) {
    row_lo[i] = 0x7fffffff;
    row_hi[i] = -1;
    row_count[i] = 0;
    if (i >= n_rows) continue;
    const int r = r_first + i;
    const int tok = per_token ? r : r / M.group;
    row_pos[i] = pos_base + tok;
    row_head[i] = hk * M.group + (per_token ? 0 : r % M.group);
    int rt[kTerms] = {};
    if constexpr (V::kHasMask && V::kMaskRowTerms > 0) V::mask_row_terms(hp, b, row_pos[i], row_head[i], hk, rt);
#pragma unroll
    for (int t = 0; t < kTerms; ++t) row_terms[i][t] = rt[t];
    if constexpr (kKeyTerm >= 0) {
      atomicMin(&term_lo, rt[kKeyTerm]);
      atomicMax(&term_hi, rt[kKeyTerm]);
    }
  }
  __syncthreads();
  // the keys any row of the tile may see: below the request's end, and within the causal flag's and the
  // mask's own bounds (the conjuncts the analysis found hold for every visible pair, an exact mask or not:
  // a document mask with causal attention inside each document sees no key past the tile's last position)
  const long long first_pos = pos_base + row0 / M.group, last_pos = pos_base + last_row / M.group;
  long long jmin = 0, jmax = kv_len - 1;
  if (M.causal) jmax = min(jmax, last_pos);
  if constexpr (V::kHasLower) jmax = min(jmax, last_pos - (long long)V::mask_lower(hp));
  if constexpr (V::kHasUpper) jmin = max(jmin, first_pos - (long long)V::mask_upper(hp));
  // a lane per row (rows lane, lane + 32, ...: a pass over the tile's keys per 32 rows), the warp walking a
  // tile's keys together: a key's reads are one address for the warp and the row's terms stay in registers
  const int passes = (n_rows + 31) / 32;
  const bool causal = M.causal != 0;
  for (int k = warp; k < M.k_tiles; k += blockDim.x / 32) {
    const int j0 = k * kKeys;
    bool any = false, all = true;  // this lane's rows, then the warp's (votes)
    bool unseen = j0 > jmax || j0 + kKeys - 1 < jmin;
    if constexpr (kKeyTerm >= 0) {
      if (!unseen) {  // the terms of the tile's keys within the bounds (the others are seen by no row)
        int lo = INT_MAX, hi = INT_MIN;
        const int j_end = int(min((long long)j0 + kKeys - 1, jmax));
        for (int j = max(j0, int(jmin)) + lane; j <= j_end; j += 32) {
          const int t = V::mask_key_term(hp, b, j, hk);
          lo = min(lo, t);
          hi = max(hi, t);
        }
        lo = lanes_reduce(lo, [](int a, int c) { return min(a, c); });
        hi = lanes_reduce(hi, [](int a, int c) { return max(a, c); });
        unseen = hi < term_lo || lo > term_hi;
      }
    }
    if (unseen) {
      all = false;  // no key of the tile is visible to any row
    } else {
      for (int p = 0; p < passes; ++p) {
        const int r = min(p * 32 + lane, n_rows - 1);  // (lanes past the rows repeat the last: no vote changes)
        const int pos = row_pos[r], qh = row_head[r];
        int rt[kTerms];
#pragma unroll
        for (int t = 0; t < kTerms; ++t) rt[t] = row_terms[r][t];
        int lo = 0x7fffffff, hi = -1, count = 0;
        for (int c0 = 0; c0 < kKeys; c0 += 32) {
          const unsigned seen = visible_keys<V>(causal, hp, b, pos, j0 + c0, kv_len, qh, hk, rt);
          any |= seen != 0u;
          all &= seen == 0xffffffffu;
          if (seen != 0u) {
            lo = min(lo, j0 + c0 + __ffs(seen) - 1);
            hi = j0 + c0 + 31 - __clz(seen);
            count += __popc(seen);
          }
        }
        if (want_rows) {
          if (count > 0 && p * 32 + lane < n_rows) {  // several warps see a row
            atomicMin(&row_lo[r], lo);
            atomicMax(&row_hi[r], hi);
            atomicAdd(&row_count[r], count);
          }
        } else if (__any_sync(0xffffffffu, any) && !__all_sync(0xffffffffu, all)) {
          break;  // a tile with a visible and an invisible pair is partial whatever its other pairs are
        }
      }
      any = __any_sync(0xffffffffu, any);
      all = __all_sync(0xffffffffu, all);
    }
    if (lane == 0) out[k] = all ? kTileFull : (any ? kTilePartial : kTileEmpty);
  }
  if (!want_rows) return;
  __syncthreads();
  // a row sees one interval when its count of visible keys spans its first to its last
  for (int i = threadIdx.x; i < kMaxRows; i += blockDim.x) {
    int2 iv = make_int2(0, -1);
    if (i < n_rows && row_count[i] > 0)
      iv = row_count[i] == row_hi[i] - row_lo[i] + 1 ? make_int2(row_lo[i], row_hi[i]) : make_int2(-1, -1);
    out_rows[i] = iv;
  }
}

// The map's lists, made by one CTA after the classifier (one launch instead of the plan's dozen tensor calls):
// each warp counts its lists' non-empty and full tiles, the CTA scans the counts into indptr (a chunk of
// blockDim lists at a time), each warp writes its lists' entries in key order (ballot ranks), then every
// (request, query tile) gets its listed tiles over its head rows and the map its counts by class; last, the work
// order: the pairs sorted by listed tiles (a counting sort: counts per value, their suffix sums, then one warp
// places the pairs in pair order, lanes of one value ranked by a match mask). Reads the map twice: about
// 2 x 0.26 MB for 64 documents packed in 32k.
template <class V, int D = V::kHeadDim>
__global__ void __launch_bounds__(1024) tile_lists_kernel(TileMapProblem M) {
  __shared__ int warp_total[32];
  __shared__ int listed_total, full_total;
  __shared__ int bins[kOrderBins];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int64_t lists = int64_t(M.batch) * M.heads * M.q_tiles;
  const TileListsOut& out = M.lists;
  if (threadIdx.x == 0) listed_total = 0, full_total = 0;
  __syncthreads();
  for (int64_t l = warp; l < lists; l += warps) {
    const uint8_t* row = M.map + l * M.k_tiles;
    int listed = 0, full = 0;
    for (int k = lane; k < M.k_tiles; k += 32) {
      const uint8_t c = row[k];
      listed += c != kTileEmpty;
      full += c == kTileFull;
    }
    listed = lanes_total(listed);
    full = lanes_total(full);
    if (lane == 0) {
      out.indptr[l + 1] = listed;
      atomicAdd(&listed_total, listed);
      atomicAdd(&full_total, full);
    }
  }
  __syncthreads();
  // indptr[1..lists]: an inclusive scan of the counts in place
  int carry = 0;
  for (int64_t base = 0; base < lists; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const int v = i < lists ? out.indptr[i + 1] : 0;
    int x = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, off);
      if (lane >= off) x += y;
    }
    if (lane == 31) warp_total[warp] = x;
    __syncthreads();
    int before = 0;
    for (int w = 0; w < warp; ++w) before += warp_total[w];
    int chunk = 0;
    for (int w = 0; w < warps; ++w) chunk += warp_total[w];
    if (i < lists) out.indptr[i + 1] = carry + before + x;
    carry += chunk;
    __syncthreads();  // (warp_total is rewritten by the next chunk)
  }
  if (threadIdx.x == 0) out.indptr[0] = 0;
  __syncthreads();
  for (int64_t l = warp; l < lists; l += warps) {
    const uint8_t* row = M.map + l * M.k_tiles;
    int at = out.indptr[l];
    for (int k0 = 0; k0 < M.k_tiles; k0 += 32) {
      const int k = k0 + lane;
      const uint8_t c = k < M.k_tiles ? row[k] : uint8_t(kTileEmpty);
      const unsigned listed = __ballot_sync(0xffffffffu, c != kTileEmpty);
      if (c != kTileEmpty) out.entries[at + __popc(listed & ((1u << lane) - 1u))] = k * 2 + (c == kTileFull);
      at += __popc(listed);
    }
  }
  __syncthreads();
  for (int p = threadIdx.x; p < M.batch * M.q_tiles; p += blockDim.x) {
    const int b = p / M.q_tiles, t = p % M.q_tiles;
    int tiles = 0;
    for (int h = 0; h < M.heads; ++h) {
      const int64_t l = (int64_t(b) * M.heads + h) * M.q_tiles + t;
      tiles += out.indptr[l + 1] - out.indptr[l];
    }
    out.pair_tiles[p] = tiles;
  }
  if (threadIdx.x == 0) {
    out.counts[0] = int(lists * M.k_tiles) - listed_total;
    out.counts[1] = listed_total - full_total;
    out.counts[2] = full_total;
  }
  const int pairs = M.batch * M.q_tiles, values = M.heads * M.k_tiles + 1;
  if (values > kOrderBins) {
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) out.order[p] = p;
    return;
  }
  for (int v = threadIdx.x; v < values; v += blockDim.x) bins[v] = 0;
  __syncthreads();  // (and pair_tiles, written above by the block's threads, is visible to them all)
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&bins[out.pair_tiles[p]], 1);
  __syncthreads();
  if (warp != 0) return;
  // bins[v] := the pairs of more tiles than v (an exclusive scan from the top value down)
  int above = 0;
  for (int base = 0; base < values; base += 32) {
    const int v = values - 1 - (base + lane);
    const int n = v >= 0 ? bins[v] : 0;
    int x = n;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, off);
      if (lane >= off) x += y;
    }
    if (v >= 0) bins[v] = above + x - n;
    above += __shfl_sync(0xffffffffu, x, 31);
  }
  __syncwarp();
  for (int base = 0; base < pairs; base += 32) {
    const int p = base + lane;
    const bool live = p < pairs;
    const int t = live ? out.pair_tiles[p] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, t);
    const int before = __popc(peers & ((1u << lane) - 1u));  // lanes of this value before this one
    const int at = live ? bins[t] : 0;
    __syncwarp();
    if (live) {
      out.order[at + before] = p;
      if (before == 0) bins[t] = at + __popc(peers);  // the value's first lane moves its cursor
    }
    __syncwarp();
  }
}

// The classifier, then (where the plan wants them) the lists: the traits' own instances, or in linked builds
// the cubin's (cubin_launch.h). A map without tiles launches nothing (the plan's zero-filled outputs stand).
template <class V>
void launch_tile_map(const TileMapProblem& M, const typename V::Params& hp, cudaStream_t stream) {
  if (M.batch == 0 || M.q_tiles == 0 || M.k_tiles == 0) return;
  using Fn = void (*)(TileMapProblem, typename V::Params);
  using ListsFn = void (*)(TileMapProblem);
  Fn kernel;
  ListsFn lists_kernel;
  if constexpr (linked_hooks<V>()) {
    kernel = linked_kernel_cached<Fn>([] { return "tile_map_kernel<" + std::to_string(V::kHeadDim) + ">"; });
    lists_kernel =
        linked_kernel_cached<ListsFn>([] { return "tile_lists_kernel<" + std::to_string(V::kHeadDim) + ">"; });
  } else {
    kernel = tile_map_kernel<V>;
    lists_kernel = tile_lists_kernel<V>;
  }
  launch_kernel(kernel, dim3(M.q_tiles, M.heads, M.batch), dim3(256), 0, stream, M, hp);
  if (M.lists.indptr != nullptr) launch_kernel(lists_kernel, dim3(1), dim3(1024), 0, stream, M);
}

}  // namespace attngen
