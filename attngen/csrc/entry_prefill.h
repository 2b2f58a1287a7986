// The exported prefill / append entries of attngen's own calling convention (runtime/cuda.py calls
// them), as templates over the variant traits V, the element type T, the head dim D, the page layout L
// (paged K/V) and the exported name (for error messages). Python emits one explicit export per
// (D, dtype, K/V source) (codegen/cuda_entries.py):
//
//   ATTNGEN_EXPORT_TYPED_FUNC(batch_prefill_ragged_f16_d128,
//       (attngen::PrefillRaggedEntry<attngen_gen::Hooks_d128, half, 128, kName>::call));
//
// Arguments, all tensors on one CUDA device (the current stream is used):
//   paged:  q [n, Hq, D], pages, indices [nnz], indptr [B+1], last_page_len [B], qo_indptr [B+1], ...
//   ragged: q [n, Hq, D], k [m, Hkv, D], v [m, Hkv, D], kv_indptr [B+1], qo_indptr [B+1], ...
//   ... o [n, Hq, D], lse [n, Hq] f32, sm_scale, max_qo_len (sizes the grid), tile_rows (PrefillTileRows),
//   kernel (PrefillTemplate: which template serves the call), tile_indptr / tile_entries (optional: the
//   plan's mask-derived tile lists, tile_map.cuh, tile_entries ending in the map rows' key intervals) and
//   tile_heads (their head rows: 1 or Hkv; 0 without),
//   work_order (optional: [B * q_tiles] int32, the plan's order of (request, query tile) pairs in the Hopper
//   tiling, longest work first; optionally followed by the plan's tail split, hopper_tail.cuh), hook_workspace (optional: uint8 bytes for the row-hook pass, hook_pass.cuh:
//   the variant's key and query transforms applied once per row ahead of the prefill), then the variant's
//   extra parameters (V::ExtraArgs).
//
// prefill_tile_map_<dtype>_d<D> (TileMapEntry) classifies the tiles of a launch for the plan:
//   qo_indptr [B+1], kv_indptr [B+1] and last_page_len [B] (optional: a paged view's) and page_size (0 for a
//   ragged view) -- the KV view's own index arrays, whose lengths the classifier computes --,
//   map [B, heads, q_tiles, k_tiles] uint8, row_keys (optional: [B * heads *
//   q_tiles, rows, 2] int32, each map row's key interval), lists and room (optional, together: the lists made
//   from the map on the device, tile_map.cuh tile_lists_kernel; lists [B * heads * q_tiles + 1 + B * q_tiles
//   + 3 + B * q_tiles] int32: indptr, each request's query tiles' listed tiles, the counts by class, the work
//   order; room: the entries),
//   group, num_kv_heads, causal, rows, keys (the template's tile), then the variant's extra parameters.
#pragma once
#include <array>
#include <tuple>

#include "attngen_enums.h"
#include "hook_pass.cuh"
#include "prefill_dispatch.h"
#include "problem_glue.h"
#include "tile_map.cuh"
#include "variant_params.h"

namespace attngen {

inline bool is_prefill_tile_rows(int64_t v) {
  return v == int64_t(PrefillTileRows::kAuto) || v == int64_t(PrefillTileRows::kRows64) ||
         v == int64_t(PrefillTileRows::kRows128);
}

using OptionalTensor = tvm::ffi::Optional<tvm::ffi::TensorView>;
using TV = tvm::ffi::TensorView;

// The plan's tile lists into P (both or neither; checked against the launch's grid), and the map rows' key
// intervals at the end of tile_entries (tile_map.cuh row_keys_offset).
inline void fill_tile_list(PrefillProblem& P, const char* name, const tvm::ffi::TensorView& q,
                           const OptionalTensor& indptr, const OptionalTensor& entries, int64_t heads) {
  if (indptr.has_value() != entries.has_value())
    ATTNGEN_THROW(ValueError) << name << ": tile_indptr and tile_entries come together (a plan's tile map) or not at all";
  if (!indptr.has_value()) {
    if (heads != 0) ATTNGEN_THROW(ValueError) << name << ": tile_heads describes a tile map; without one pass 0";
    return;
  }
  check_args(name, {{"tile_indptr", *indptr, 1, dl_dtype<int32_t>()}, {"tile_entries", *entries, 1, dl_dtype<int32_t>()}},
             q.device().device_id);
  if (heads != 1 && heads != P.num_kv_heads)
    ATTNGEN_THROW(ValueError) << name << ": tile_heads must be 1 or the number of KV heads (" << P.num_kv_heads << ")";
  const int64_t lists = (*indptr).size(0) - 1;
  if (P.batch == 0) return;  // nothing to launch
  if (lists % (int64_t(P.batch) * heads) != 0)
    ATTNGEN_THROW(ValueError) << name << ": tile_indptr has " << lists << " lists, not batch x tile_heads x query "
                              << "tiles: plan again for this batch";
  constexpr int kMapRows = MapTile<128>::kRows;  // (every head dim's map tile has as many rows)
  const int64_t at = row_keys_offset((*entries).size(0), lists, kMapRows);
  if (at < 0)
    ATTNGEN_THROW(ValueError) << name << ": tile_entries holds no key interval per map row (" << lists << " x "
                              << kMapRows << " pairs at its end): plan again";
  const auto* entry_data = static_cast<const int32_t*>(data_of(*entries));
  if (reinterpret_cast<uintptr_t>(entry_data + at) % alignof(int2) != 0)
    ATTNGEN_THROW(ValueError) << name << ": tile_entries' key intervals (its last " << 2 * lists * kMapRows
                              << " values) do not start on 8 bytes: pass the plan's tile_entries unsliced";
  P.tiles = TileList{static_cast<const int32_t*>(data_of(*indptr)), entry_data, static_cast<int>(heads),
                     static_cast<int>(lists / (int64_t(P.batch) * heads)),
                     reinterpret_cast<const int2*>(entry_data + at)};
}

// The plan's work order into P: one entry per (request, query tile) pair of the Hopper template's grid.
template <int D>
void fill_work_order(PrefillProblem& P, const char* name, const tvm::ffi::TensorView& q, const OptionalTensor& order,
                     int64_t max_qo_len) {
  if (!order.has_value()) return;
  check_args(name, {{"work_order", *order, 1, dl_dtype<int32_t>()}}, q.device().device_id);
  static_assert(HopperTile<D>::kRows == kOrderRows, "the order's entries count the Hopper template's query tiles");
  const int64_t pairs = int64_t(P.batch) * ((max_qo_len * P.group + kOrderRows - 1) / kOrderRows);
  // (entries past the pairs: the plan's Hopper tail split, runtime/work_tail.py, or mma.sync split,
  // runtime/mma_split.py, which the kernels check themselves)
  if ((*order).size(0) < pairs || ((*order).size(0) > pairs && (*order).size(0) < pairs + kTailHeader))
    ATTNGEN_THROW(ValueError) << name << ": work_order has " << (*order).size(0) << " entries, not batch x query "
                              << "tiles (" << pairs << ") and a tail split: plan again for this batch";
  if ((*order).size(0) - pairs > 0x7fffffffLL)
    ATTNGEN_THROW(ValueError) << name << ": work_order's tail split is too large: plan again for this batch";
  P.work_order = static_cast<const int32_t*>(data_of(*order));
  P.work_tail_len = static_cast<int>((*order).size(0) - pairs);
}

// The plan's part of a prefill call, the arguments after sm_scale (runtime/cuda.py PrefillPlan.ffi_args).
struct PrefillLaunchArgs {
  int64_t max_qo_len, tile_rows, kernel;
  OptionalTensor tile_indptr, tile_entries;
  int64_t tile_heads;
  OptionalTensor work_order;
  OptionalTensor hook_workspace;
};

// Element types, ranks and devices of a prefill call's tensors, one check_args list in the entry's argument
// order: q, the K/V source's tensors (`kv`: paged or ragged), qo_indptr, o, lse, then the entry's own tensors
// after lse (an fp8 entry's scales). q and o are of T.
template <class T, size_t N, class... Own>
void check_prefill_args(const char* name, const TV& q, const std::array<TensorArg, N>& kv, const TV& qo_indptr,
                        const TV& o, const TV& lse, const Own&... own) {
  std::apply(
      [&](const auto&... source) {
        check_args(name, {{"q", q, 3, dl_dtype<T>()},
                          source...,
                          {"qo_indptr", qo_indptr, 1, dl_dtype<int32_t>()},
                          {"o", o, 3, dl_dtype<T>()},
                          {"lse", lse, 2, dl_dtype<float>()},
                          own...});
      },
      kv);
}

// check_prefill_args of a paged call: pages of KV (T, or an fp8 format: entry_prefill_fp8.h).
template <class T, class KV = T, class... Own>
void check_paged_prefill_args(const char* name, const TV& q, const TV& pages, const TV& indices, const TV& indptr,
                              const TV& last_page_len, const TV& qo_indptr, const TV& o, const TV& lse,
                              const Own&... own) {
  const std::array<TensorArg, 4> kv{{{"pages", pages, 5, dl_dtype<KV>()},
                                     {"indices", indices, 1, dl_dtype<int32_t>()},
                                     {"indptr", indptr, 1, dl_dtype<int32_t>()},
                                     {"last_page_len", last_page_len, 1, dl_dtype<int32_t>()}}};
  check_prefill_args<T>(name, q, kv, qo_indptr, o, lse, own...);
}

// check_prefill_args of a ragged call: k and v of KV.
template <class T, class KV = T, class... Own>
void check_ragged_prefill_args(const char* name, const TV& q, const TV& k, const TV& v, const TV& kv_indptr,
                               const TV& qo_indptr, const TV& o, const TV& lse, const Own&... own) {
  const std::array<TensorArg, 3> kv{{{"k", k, 3, dl_dtype<KV>()},
                                     {"v", v, 3, dl_dtype<KV>()},
                                     {"kv_indptr", kv_indptr, 1, dl_dtype<int32_t>()}}};
  check_prefill_args<T>(name, q, kv, qo_indptr, o, lse, own...);
}

// The plan's part of a call into P (any prefill problem type, once it holds the problem), checked.
template <class V, int D>
void fill_prefill_launch(const char* name, PrefillProblem& P, const TV& q, const PrefillLaunchArgs& a) {
  fill_tile_list(P, name, q, a.tile_indptr, a.tile_entries, a.tile_heads);
  fill_work_order<D>(P, name, q, a.work_order, a.max_qo_len);
  if (!is_prefill_tile_rows(a.tile_rows))
    ATTNGEN_THROW(ValueError) << name << ": tile_rows must be 0 (the library's choice), 64 or 128";
  if (!is_prefill_template(a.kernel))
    ATTNGEN_THROW(ValueError) << name << ": kernel must be a PrefillTemplate (0 auto, 1 mma.sync, 2 Hopper)";
  if (const char* why = prefill_template_problem(static_cast<int>(a.kernel)))
    ATTNGEN_THROW(ValueError) << name << ": " << why << "; plan with the default template";
  P.tile_rows = static_cast<int>(a.tile_rows);
  P.kernel = static_cast<int>(a.kernel);
  if (P.tiles.present()) {
    if (const char* why = tile_list_problem<V, D>(P, static_cast<int>(a.max_qo_len)))
      ATTNGEN_THROW(ValueError) << name << ": " << why << "; plan again";
  }
}

// The row-hook pass (hook_pass.cuh) where the call brings its workspace: the variant's key and query
// transforms applied once per row into it, then P reads its keys (and a paged view's values, through an
// identity page table) and queries from there. kv_units: rows of a ragged k, entries of a page table.
template <class V, class T, int D>
void apply_hook_pass(const char* name, PrefillProblem& P, const TV& q, const OptionalTensor& ws, int64_t kv_units,
                     const typename V::Params& hp) {
  if (!ws.has_value()) return;
  if constexpr (!V::kHasKeyTransform && !V::kHasQueryTransform) {
    ATTNGEN_THROW(ValueError) << name << ": hook_workspace: the variant has no key or query transform to apply "
                              << "ahead of the prefill; pass None";
  } else {
    check_args(name, {{"hook_workspace", *ws, 1, dl_dtype<uint8_t>()}}, q.device().device_id);
    KVRows& kv = P.kv;
    const bool paged = kv.page_size > 0;
    int64_t key_bytes = 0;
    if (V::kHasKeyTransform && kv_units > 0) {
      if (paged) {  // packed pages [2][page_size][Hkv][D] (hook_pass_packed_pages), whatever the pool's strides
        key_bytes = kv_units * 2 * int64_t(kv.page_size) * P.num_kv_heads * D * int64_t(sizeof(T));
      } else {
        key_bytes = ((kv_units - 1) * kv.stride_slot + int64_t(P.num_kv_heads - 1) * kv.stride_head + D) *
                    int64_t(sizeof(T));
      }
    }
    const int64_t query_bytes = V::kHasQueryTransform ? P.q_rows * P.num_qo_heads * D * int64_t(sizeof(T)) : 0;
    const HookPassLayout l = hook_pass_layout(key_bytes, query_bytes, paged && V::kHasKeyTransform ? kv_units : 0);
    if ((*ws).size(0) < l.bytes)
      ATTNGEN_THROW(ValueError) << name << ": hook_workspace: " << (*ws).size(0) << " bytes, the row-hook pass of "
                                << "this call needs " << l.bytes << "; size it for this call's q and K/V";
    unsigned char* base = static_cast<unsigned char*>(data_of(*ws));
    HookPassProblem H{};
    H.kv = kv;
    H.k_out = V::kHasKeyTransform ? base + l.keys : nullptr;
    H.page_ids = paged && V::kHasKeyTransform ? reinterpret_cast<int32_t*>(base + l.page_ids) : nullptr;
    if (paged && V::kHasKeyTransform) H.out = hook_pass_packed_pages<D>(kv, P.num_kv_heads, H.k_out, H.page_ids);
    H.q = P.q;
    H.q_stride = P.q_stride;
    H.q_out = V::kHasQueryTransform ? base + l.queries : nullptr;
    H.qo_indptr = P.qo_indptr;
    H.kv_units = kv_units;
    H.q_rows = P.q_rows;
    H.batch = P.batch;
    H.num_kv_heads = P.num_kv_heads;
    H.num_qo_heads = P.num_qo_heads;
    H.bf16 = std::is_same_v<T, __nv_bfloat16>;
    launch_hook_pass<V>(H, hp, stream_of(q));
    if constexpr (V::kHasKeyTransform) {
      if (paged) {
        kv = H.out;  // the workspace's page i holds entry i's page, packed
        kv.rows = kv_units;  // (its pages: the bulk copies' bound)
      } else {  // the keys from the workspace, the values where they were
        const char* v = static_cast<const char*>(kv.base) + kv.stride_kv * int64_t(sizeof(T));
        kv.stride_kv = (v - reinterpret_cast<const char*>(H.k_out)) / int64_t(sizeof(T));
      }
      kv.base = H.k_out;
      P.hooks_applied |= kKeysApplied;
    }
    if constexpr (V::kHasQueryTransform) {
      P.q = H.q_out;
      P.q_stride = int64_t(P.num_qo_heads) * D;  // (the pass writes its rows packed)
      P.hooks_applied |= kQueriesApplied;
    }
  }
}

// The launch shared by the paged and ragged entries, once P holds the problem (kv_units: apply_hook_pass).
template <class V, class T, int D>
void run_prefill(const char* name, PrefillProblem& P, const TV& q, const PrefillLaunchArgs& a,
                 const typename V::Params& hp, int64_t kv_units) {
  fill_prefill_launch<V, D>(name, P, q, a);
  apply_hook_pass<V, T, D>(name, P, q, a.hook_workspace, kv_units, hp);
  launch_prefill_any<V, T, D>(P, static_cast<int>(a.max_qo_len), hp, stream_of(q));
  check_launch(name);
}

template <class V, class T, int D, KVLayout L, const char* Name, class Extra = typename V::ExtraArgs>
struct PrefillPagedEntry;

template <class V, class T, int D, KVLayout L, const char* Name, class... X>
struct PrefillPagedEntry<V, T, D, L, Name, ArgList<X...>> {
  static void call(TV q, TV pages, TV indices, TV indptr, TV last_page_len, TV qo_indptr, TV o, TV lse,
                   double sm_scale, int64_t max_qo_len, int64_t tile_rows, int64_t kernel, OptionalTensor tile_indptr,
                   OptionalTensor tile_entries, int64_t tile_heads, OptionalTensor work_order,
                   OptionalTensor hook_workspace, X... extra) {
    check_paged_prefill_args<T>(Name, q, pages, indices, indptr, last_page_len, qo_indptr, o, lse);
    typename V::Params hp{};
    V::set_params(Name, hp, extra...);
    PrefillProblem P{};
    const int kv_heads = kv_from_pages<L>(P.kv, pages, indptr, indices, last_page_len, 16, D);
    fill_prefill(P, q, qo_indptr, o, lse, sm_scale, kv_heads, Name);
    run_prefill<V, T, D>(
        Name, P, q,
        {max_qo_len, tile_rows, kernel, tile_indptr, tile_entries, tile_heads, work_order, hook_workspace}, hp,
        indices.size(0));
  }
};

template <class V, class T, int D, const char* Name, class Extra = typename V::ExtraArgs>
struct PrefillRaggedEntry;

template <class V, class T, int D, const char* Name, class... X>
struct PrefillRaggedEntry<V, T, D, Name, ArgList<X...>> {
  static void call(TV q, TV k, TV v, TV kv_indptr, TV qo_indptr, TV o, TV lse, double sm_scale, int64_t max_qo_len,
                   int64_t tile_rows, int64_t kernel, OptionalTensor tile_indptr, OptionalTensor tile_entries,
                   int64_t tile_heads, OptionalTensor work_order, OptionalTensor hook_workspace, X... extra) {
    check_ragged_prefill_args<T>(Name, q, k, v, kv_indptr, qo_indptr, o, lse);
    typename V::Params hp{};
    V::set_params(Name, hp, extra...);
    PrefillProblem P{};
    fill_prefill(P, q, qo_indptr, o, lse, sm_scale, kv_from_ragged<T>(P.kv, k, v, kv_indptr), Name);
    run_prefill<V, T, D>(
        Name, P, q,
        {max_qo_len, tile_rows, kernel, tile_indptr, tile_entries, tile_heads, work_order, hook_workspace}, hp,
        k.size(0));
  }
};

template <class V, int D, const char* Name, class Extra = typename V::ExtraArgs>
struct TileMapEntry;

template <class V, int D, const char* Name, class... X>
struct TileMapEntry<V, D, Name, ArgList<X...>> {
  static void call(tvm::ffi::TensorView qo_indptr, tvm::ffi::TensorView kv_indptr, OptionalTensor last_page_len,
                   int64_t page_size, tvm::ffi::TensorView map, OptionalTensor row_keys, OptionalTensor lists,
                   OptionalTensor room, int64_t group, int64_t num_kv_heads, int64_t causal, int64_t rows,
                   int64_t keys, X... extra) {
    check_args(Name, {{"qo_indptr", qo_indptr, 1, dl_dtype<int32_t>()},
                      {"kv_indptr", kv_indptr, 1, dl_dtype<int32_t>()},
                      {"map", map, 4, dl_dtype<uint8_t>()}});
    typename V::Params hp{};
    V::set_params(Name, hp, extra...);
    TileMapProblem M{};
    M.qo_indptr = static_cast<const int32_t*>(data_of(qo_indptr));
    M.kv_indptr = static_cast<const int32_t*>(data_of(kv_indptr));
    M.map = static_cast<uint8_t*>(data_of(map));
    M.batch = static_cast<int>(qo_indptr.size(0)) - 1;
    if (last_page_len.has_value()) {
      check_args(Name, {{"last_page_len", *last_page_len, 1, dl_dtype<int32_t>()}}, qo_indptr.device().device_id);
      if ((*last_page_len).size(0) != M.batch)
        ATTNGEN_THROW(ValueError) << Name << ": last_page_len needs one entry per request (" << M.batch << ")";
      if (page_size < 1)
        ATTNGEN_THROW(ValueError) << Name << ": page_size must be positive with last_page_len (a paged view)";
      M.last_page_len = static_cast<const int32_t*>(data_of(*last_page_len));
      M.page_size = static_cast<int>(page_size);
    } else if (page_size != 0) {
      ATTNGEN_THROW(ValueError) << Name << ": page_size describes a paged view; without last_page_len pass 0";
    }
    M.group = static_cast<int>(group);
    M.num_kv_heads = static_cast<int>(num_kv_heads);
    M.causal = static_cast<int>(causal);
    M.rows = static_cast<int>(rows);
    M.keys = static_cast<int>(keys);
    M.heads = static_cast<int>(map.size(1));
    M.q_tiles = static_cast<int>(map.size(2));
    M.k_tiles = static_cast<int>(map.size(3));
    if (row_keys.has_value()) {
      check_args(Name, {{"row_keys", *row_keys, 3, dl_dtype<int32_t>()}}, qo_indptr.device().device_id);
      const TV& rk = *row_keys;
      if (rk.size(0) != int64_t(M.batch) * M.heads * M.q_tiles || rk.size(1) != MapTile<D>::kRows || rk.size(2) != 2)
        ATTNGEN_THROW(ValueError) << Name << ": row_keys must be [batch x map heads x query tiles, "
                                  << MapTile<D>::kRows << ", 2] int32 (one key interval per map row)";
      M.row_keys = reinterpret_cast<int2*>(data_of(rk));
    }
    if (lists.has_value() != room.has_value())
      ATTNGEN_THROW(ValueError) << Name << ": lists and room come together (the plan's tile lists) or not at all";
    if (lists.has_value()) {
      check_args(Name, {{"lists", *lists, 1, dl_dtype<int32_t>()}, {"room", *room, 1, dl_dtype<int32_t>()}},
                 qo_indptr.device().device_id);
      const int64_t n_lists = int64_t(M.batch) * M.heads * M.q_tiles;
      const int64_t pairs = int64_t(M.batch) * M.q_tiles;
      if ((*lists).size(0) != n_lists + 1 + pairs + 3 + pairs)
        ATTNGEN_THROW(ValueError) << Name << ": lists must hold " << n_lists + 1 + pairs + 3 + pairs
                                  << " int32 (indptr of batch x map heads x query tiles lists, each request's "
                                  << "query tiles' listed tiles, 3 class counts, the work order)";
      if ((*room).size(0) < n_lists * M.k_tiles)
        ATTNGEN_THROW(ValueError) << Name << ": room must hold at least " << n_lists * M.k_tiles
                                  << " int32 (a slot per map tile)";
      auto* l = static_cast<int32_t*>(data_of(*lists));
      M.lists = TileListsOut{l, l + n_lists + 1, l + n_lists + 1 + pairs, static_cast<int32_t*>(data_of(*room)),
                             l + n_lists + 1 + pairs + 3};
    }
    if (kv_indptr.size(0) != M.batch + 1 || map.size(0) != M.batch)
      ATTNGEN_THROW(ValueError) << Name << ": kv_indptr needs batch + 1 entries and map one per request (" << M.batch
                                << " requests)";
    if (M.heads != (V::kMaskReadsHeads ? M.num_kv_heads : 1))
      ATTNGEN_THROW(ValueError) << Name << ": map's head rows must be "
                                << (V::kMaskReadsHeads ? "num_kv_heads (the mask reads a head index)"
                                                       : "1 (the mask reads no head index)");
    if (M.group < 1)
      ATTNGEN_THROW(ValueError) << Name << ": group must be positive";
    if (M.rows != MapTile<D>::kRows || M.keys != MapTile<D>::kKeys)
      ATTNGEN_THROW(ValueError) << Name << ": rows and keys must be the templates' map tile, " << MapTile<D>::kRows
                                << " x " << MapTile<D>::kKeys << " at head_dim " << D;
    launch_tile_map<V>(M, hp, stream_of(qo_indptr));
    check_launch(Name);
  }
};

}  // namespace attngen
