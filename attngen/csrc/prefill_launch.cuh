// The launchers of the mma.sync prefill template (prefill.cuh): the kernel instance (the traits' own, or by
// name from a linked cubin) and the tile configuration the device's shared memory holds. KV is the cache's
// element type: the query dtype T (the default), or an fp8 format, whose configurations count the staging
// area (prefill_smem_bytes) and whose problem carries the scales (PrefillProblemOf).
#pragma once
#include "cubin_launch.h"
#include "device_info.cuh"
#include "hook_abi.h"
#include "prefill.cuh"
#include "tvm_traits.cuh"

namespace attngen {

// The kernel: the traits' own instantiation, or by name from a linked cubin (decode_launch.cuh), whose key
// ends in the cache's element type.
template <class V, class T, int D, bool Small, int MT, class KV = T, bool Mapped = false>
auto prefill_kernel_ref() {
  using Fn = void (*)(PrefillProblemOf<KV>, typename V::Params);
  if constexpr (linked_hooks<V>()) {
    return linked_kernel_cached<Fn>(
        [] { return kernel_key<T>("prefill_kernel", D, Small, MT, Mapped, kernel_type_name<KV>()); });
  } else {
    return Fn(prefill_kernel<V, T, D, Small, MT, Mapped, KV>);
  }
}

template <class V, class T, int D, bool Small, int MT, class KV = T>
void launch_prefill_tile(const PrefillProblemOf<KV>& P, int max_qo_len, const typename V::Params& hp,
                         cudaStream_t stream) {
  using Tile = PrefillTile<D, Small, MT>;
  const size_t smem = prefill_smem_bytes<V, T, D, Small, MT, KV>();
  auto kernel = prefill_kernel_ref<V, T, D, Small, MT, KV>();
  // the instance walking a tile map (TVM's windowed / tree / RoPE instances make no maps)
  if constexpr (variant_maps_tiles<V>() && !tvm_instance<V>()) {
    if (P.tiles.present()) kernel = prefill_kernel_ref<V, T, D, Small, MT, KV, true>();
  }
  if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  const int tiles = (max_qo_len * P.group + Tile::kRows - 1) / Tile::kRows;
  if (tiles == 0 || P.batch == 0) return;
  // split-KV (prefill_split.cuh): the chunks a plan's section behind its order asks of this tile; the kernel reads
  // the section alone (the order's entries are the Hopper template's); none with tile maps
  const int64_t items = int64_t(tiles) * P.num_kv_heads * P.batch;
  const int64_t pairs = int64_t(P.batch) * ((int64_t(max_qo_len) * P.group + kOrderRows - 1) / kOrderRows);
  // (64-row tiles only: a plan splits no launch whose rows may take the 128-row ones, runtime/mma_split.py)
  const int splits = MT == 1 && P.work_order != nullptr && !P.tiles.present()
                         ? mma_split_count<D, MT, Tile::kThreads>(pairs, P.work_tail_len, items) : 0;
  PrefillProblemOf<KV> Q = P;
  if (splits > 0) Q.work_order = P.work_order + pairs;
  launch_kernel(kernel, dim3(tiles * P.num_kv_heads, splits > 0 ? splits : 1, P.batch), dim3(Tile::kThreads), smem,
                stream, Q, hp);
}

// Rows (tokens x group heads) of the longest request from which the wide tile is used.
constexpr int kPrefillWideRows = 256;

// The 128-row tile unless 64-row tiles are asked for (P.tile_rows == 64), where the requests are
// long enough and D <= 128 (on the H200 it ran causal prefill at L 4k / 16k 1.30x / 1.31x faster than
// the 64-row tile); else the big 64-row configuration where the device's opt-in shared memory holds
// it, else the small one. (fp8 K/V need less shared memory than two 16-bit stages: on sm_86 / sm_89 their
// wide tile at D 128 and big tile at D 256 fit where the 16-bit ones do not.)
template <class V, class T, int D, class KV = T>
void launch_prefill(const PrefillProblemOf<KV>& P, int max_qo_len, const typename V::Params& hp,
                    cudaStream_t stream) {
  const size_t optin = size_t(device_smem_optin());
  // (TVM's windowed instances: their 128-row tile spilled; tree forwards are small and RoPE instances rare: one
  // tile size fewer to build)
  if constexpr (D <= 128 && !tvm_instance<V>()) {
    if (P.tile_rows != 64 && int64_t(max_qo_len) * P.group >= kPrefillWideRows &&
        optin >= prefill_smem_bytes<V, T, D, false, 2, KV>())
      return launch_prefill_tile<V, T, D, false, 2, KV>(P, max_qo_len, hp, stream);
  }
  // the small tile: for devices below the big one's shared memory only (not compiled where the build's
  // floor holds the big one, device_info.cuh kSmemOptinFloor)
  if constexpr (prefill_smem_bytes<V, T, D, false, 1, KV>() <= kSmemOptinFloor) {
    launch_prefill_tile<V, T, D, false, 1, KV>(P, max_qo_len, hp, stream);
  } else if (optin >= prefill_smem_bytes<V, T, D, false, 1, KV>()) {
    launch_prefill_tile<V, T, D, false, 1, KV>(P, max_qo_len, hp, stream);
  } else {
    launch_prefill_tile<V, T, D, true, 1, KV>(P, max_qo_len, hp, stream);
  }
}

}  // namespace attngen
