// The Hopper prefill's host side (hopper_prefill.cuh holds the kernel): whether this build and device run
// it, the kernel of a traits type (its own instantiation or, in linked builds, from the cubin), and the
// persistent launch (one CTA per SM, or per work item where fewer).
#pragma once
#include "hopper_prefill.cuh"

namespace attngen {

// Whether the Hopper kernels are in this build (the library was compiled for sm_90a) and the device runs
// them (compute capability 9.0).
inline bool hopper_prefill_runs_here() {
#if defined(ATTNGEN_WITH_PREFILL_HOPPER)
  return device_cc_major() == 9;
#else
  return false;
#endif
}

// The kernel: the traits' own instantiation, or by name from a linked cubin (cubin_launch.h).
template <class V, class T, int D, class KV = T, bool Mapped = false, bool Wide = hopper_wide_tiles<V, T, KV>(),
          bool Split = false>
auto hopper_prefill_kernel_ref() {
  using Fn = void (*)(PrefillProblemOf<KV>, typename V::Params, HopperKVMaps, int);
  if constexpr (linked_hooks<V>()) {
    static_assert(!Split, "linked builds hold no Split instance: plans give their masked variants no tail split");
    return linked_kernel_cached<Fn>(
        [] { return kernel_key<T>("hopper_prefill_kernel", D, Mapped, kernel_type_name<KV>(), Wide, false); });
  } else {
    return Fn(hopper_prefill_kernel<V, T, D, Mapped, KV, Wide, Split>);
  }
}

template <class V>
using HopperMaskedSplitFlag = std::bool_constant<V::kHopperMaskedSplit>;

// Whether a variant's kernels have a Split instance (hopper_prefill.cuh) for the plan's tail splits: a mask
// hook that is its constant bounds and no logits hook (kHopperMaskedSplit: the same predicate the planner
// asks, ir/mask_class.py bounds_are_the_mask), 16-bit K/V, outside TVM's conventions, in whole-program builds
// (runtime/work_order.py gives the others' plans no split)
template <class V, class T, class KV>
constexpr bool hopper_split_instance() {
  return trait_flag<V, HopperMaskedSplitFlag>() && V::kHasMask && V::kMaskExact && !V::kHasLogits &&
         std::is_same_v<KV, T> && !tvm_instance<V>() && !linked_hooks<V>();
}

// One tiling's launch (Wide: 176 keys per tile at D 128, 192 at D 64; Split: a masked variant's instance for a
// plan's tail split).
template <class V, class T, int D, class KV, bool Wide, bool Split = false>
void launch_hopper_tiling(const PrefillProblemOf<KV>& P, int max_qo_len, const typename V::Params& hp,
                          cudaStream_t stream) {
  using Tile = HopperTile<D, Wide>;
  constexpr size_t smem = hopper_prefill_smem_bytes<T, D, Wide>();
  auto kernel = hopper_prefill_kernel_ref<V, T, D, KV, false, Wide, Split>();
  // the instance walking a tile map (TVM's windowed calls take none)
  if constexpr (variant_maps_tiles<V>() && !tvm_windowed<V>()) {
    static_assert(!Wide, "variants whose kernels walk tile maps run the map's tiling");
    if (P.tiles.present()) kernel = hopper_prefill_kernel_ref<V, T, D, KV, true, Wide>();
  }
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  const int tiles = (max_qo_len * P.group + Tile::kRows - 1) / Tile::kRows;
  if (tiles == 0 || P.batch == 0) return;
  HopperKVMaps maps{};  // use = 0: every tile gathered (always for fp8 caches, whose tiles are widened)
  // (keys a key transform changes per tile are gathered, unless the row-hook pass applied it)
  if constexpr (std::is_same_v<KV, T>) {
    if (!V::kHasKeyTransform || (P.hooks_applied & kKeysApplied)) {
      if (P.kv.page_size == 0) {
        encode_ragged_kv_maps<T, D, Tile::kKeys>(maps, P.kv, P.num_kv_heads);
      } else if constexpr (!tvm_windowed<V>()) {  // (TVM's windowed views read rows through sinks)
        encode_paged_kv_maps<T, D, Tile::kKeys>(maps, P.kv, P.num_kv_heads);
      }
    }
  }
  encode_query_map<T, D, Tile::kRows>(maps, P.q, P.q_rows, P.q_stride, P.num_kv_heads, P.group);
  // persistent: one CTA per SM (or per item, where fewer and the plan splits none) walks items blockIdx.x,
  // + gridDim.x, ...; the producer runs ahead into the next item's K/V while the consumers finish the last one
  // (a plan's tail split, runtime/work_tail.py, deals its pieces over every SM: hopper_tail_load_pieces checks)
  const int64_t items = int64_t(tiles) * P.num_kv_heads * P.batch;
  const int ctas = P.work_tail_len > 0 ? device_sm_count() : int(std::min<int64_t>(items, device_sm_count()));
  // (a tail split's pieces may wait on one another: a cooperative launch, so that a grid the device cannot hold at
  // once fails here, reported by check_launch, rather than spin)
  launch_kernel_with(LaunchAttrs{P.work_tail_len > 0}, kernel, dim3(ctas), dim3(Tile::kThreads), smem, stream, P, hp,
                     maps, tiles);
}

// KV: the cache's element type (fp8 caches: the same shared memory, the tiles staged inside the stages). A
// variant with both tilings (hopper_wide_choice) takes the wide one where the longest request has
// kHopperWideRows query rows or more, unless a paged view's boxes would shrink on it (paged_boxes_kept).
template <class V, class T, int D, class KV = T>
void launch_hopper_prefill(const PrefillProblemOf<KV>& P, int max_qo_len, const typename V::Params& hp,
                           cudaStream_t stream) {
#if defined(ATTNGEN_WITH_PREFILL_HOPPER)
  if constexpr (hopper_split_instance<V, T, KV>()) {  // (a split runs the 128-key tiling, as its plan counts)
    if (P.work_tail_len > 0 && !P.tiles.present())
      return launch_hopper_tiling<V, T, D, KV, false, true>(P, max_qo_len, hp, stream);
  }
  if constexpr (hopper_wide_choice<V, T, KV>()) {
    if (max_qo_len >= kHopperWideRows &&
        paged_boxes_kept<D, HopperTile<D>::kKeys, HopperTile<D, true>::kKeys>(P.kv.page_size))
      return launch_hopper_tiling<V, T, D, KV, true>(P, max_qo_len, hp, stream);
    return launch_hopper_tiling<V, T, D, KV, false>(P, max_qo_len, hp, stream);
  } else {
    launch_hopper_tiling<V, T, D, KV, hopper_wide_tiles<V, T, KV>()>(P, max_qo_len, hp, stream);
  }
#endif
}

}  // namespace attngen
