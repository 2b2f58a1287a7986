// Host launcher for decode: picks the template (CUDA cores or tensor cores) and its tile,
// then merges split chunks.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "attngen_enums.h"
#include "cubin_launch.h"
#include "decode.cuh"
#include "device_info.cuh"
#include "decode_tc.cuh"
#include "hook_abi.h"
#include "merge.cuh"

namespace attngen {

// Which kernels a link-time template object instantiates (codegen/lto.py compiles the decode record in
// two parts that link in parallel): bit 1 the CUDA-core kernels, bit 2 the tensor-core ones and the merge.
// The part's launcher is never run (the library's launch object finds every kernel by name), so the
// kernels left out are null pointers there.
#ifndef ATTNGEN_DECODE_KERNELS
#define ATTNGEN_DECODE_KERNELS 3
#endif

// The launchers' kernels: the traits' own instantiations, or for linked traits (hook_abi.h) the
// same instances by name from the linked cubin, without instantiating the kernel templates here. KV: the
// cache's element type (T, or an fp8 format: entry_decode_fp8.h), the key's last argument.
template <class V, class T, int D, int G, class KV = T>
auto decode_kernel_ref() {
  using Fn = void (*)(DecodeProblemOf<KV>, typename V::Params);
  if constexpr (linked_hooks<V>())
    return linked_kernel_cached<Fn>([] { return kernel_key<T>("decode_kernel", D, G, kernel_type_name<KV>()); });
  else if constexpr ((ATTNGEN_DECODE_KERNELS & 1) == 0)
    return Fn(nullptr);
  else
    return Fn(decode_kernel<V, T, D, G, KV>);
}

template <class V, class T, int D, int S, class KV = T>
auto decode_tc_kernel_ref() {
  using Fn = void (*)(DecodeProblemOf<KV>, typename V::Params);
  if constexpr (linked_hooks<V>())
    return linked_kernel_cached<Fn>([] { return kernel_key<T>("decode_tc_kernel", D, S, kernel_type_name<KV>()); });
  else if constexpr ((ATTNGEN_DECODE_KERNELS & 2) == 0)
    return Fn(nullptr);
  else
    return Fn(decode_tc_kernel<V, T, D, S, KV>);
}

template <class V, class T, int D>
auto merge_decode_kernel_ref() {
  using Fn = void (*)(DecodeProblem, typename V::Params);
  if constexpr (linked_hooks<V>())
    return linked_kernel_cached<Fn>([] { return kernel_key<T>("merge_decode_kernel", D); });
  else if constexpr ((ATTNGEN_DECODE_KERNELS & 2) == 0)
    return Fn(nullptr);
  else
    return Fn(merge_decode_kernel<V, T, D>);
}

// A launch with the programmatic stream-serialization attribute on sm_90+ (the kernel may start while the
// one before it finishes, and waits for it in grid_dependency_wait); a plain launch before sm_90 or where
// the driver refuses the attribute (launch_kernel_with).
template <class Kernel, class Problem, class Params>
void launch_dependent(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const Problem& P,
                      const Params& hp) {
  launch_kernel_with(LaunchAttrs{false, device_cc_major() >= 9}, kernel, grid, block, smem, stream, P, hp);
}

// The merge of split chunks (partial states are float32 whatever the cache holds), launched as a programmatic dependent of the decode kernel on sm_90+: its
// launch overlaps the decode kernel's last CTAs, and its blocks wait (grid_dependency_wait) for the
// partial states.
template <class V, class T, int D>
void launch_decode_merge(const DecodeProblem& P, const typename V::Params& hp, cudaStream_t stream) {
  int rows = 0;
  if (P.plan != nullptr) rows = P.plan_max_merges;
  else if (P.num_chunks > 1) rows = P.batch;
  if (rows == 0) return;
  launch_dependent(merge_decode_kernel_ref<V, T, D>(), dim3(P.num_qo_heads, rows), dim3(kMergeGroups * D / 8), 0,
                   stream, P, hp);
}

template <class V, class T, int D, int G, class KV = T>
void launch_decode_tile(const DecodeProblemOf<KV>& P, const typename V::Params& hp, cudaStream_t stream) {
  using Tile = DecodeTile<D, G>;
  const size_t smem = decode_smem_bytes<V, T, D, G, KV>();
  auto kernel = decode_kernel_ref<V, T, D, G, KV>();
  if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  launch_kernel(kernel, dim3(P.num_chunks, P.num_kv_heads, P.batch), dim3(Tile::kLanes, G, Tile::kZ), smem, stream,
                P, hp);
  launch_decode_merge<V, T, D>(P, hp, stream);
}

template <class V, class T, int D, int S, class KV = T>
void launch_decode_tc_tile(const DecodeProblemOf<KV>& P, const typename V::Params& hp, cudaStream_t stream) {
  const size_t smem = decode_tc_smem_bytes<D, S, kIsFp8<KV>>();
  auto kernel = decode_tc_kernel_ref<V, T, D, S, KV>();
  if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  // KV heads, or pairs of them: the kernel's own rule (decode_tc_items), so the grid and the kernel never disagree
  const int rows = (P.num_kv_heads * (P.group_parts > 1 ? P.group_parts : 1)) >>
                   (decode_tc_pairs_kv_heads<D, kIsFp8<KV>>() ? P.kv_head_shift : 0);
  const dim3 grid = P.plan ? dim3(P.plan_ctas, rows, 1) : dim3(P.num_chunks, rows, P.batch);
  launch_dependent(kernel, grid, dim3(DecodeTCTile<D, S>::kThreads), smem, stream, P, hp);
  launch_decode_merge<V, T, D>(P, hp, stream);
}

// The stage count the tensor-core launcher picks on a device with `optin` bytes of shared memory per block: the
// default, else (devices below the floor only) 2, then 1. Calls pick(std::integral_constant<int, S>{}) with it;
// false when none fits. One rule for the launch and for the planner's occupancy query.
template <int D, bool kFp8, class Pick>
bool with_decode_tc_stages(size_t optin, Pick&& pick) {
  constexpr int S = decode_tc_stages<D, kFp8>();
  if (optin >= decode_tc_smem_bytes<D, S, kFp8>()) return pick(std::integral_constant<int, S>{}), true;
  if constexpr (decode_tc_smem_bytes<D, S, kFp8>() > kSmemOptinFloor) {
    if constexpr (S > 2) {
      if (optin >= decode_tc_smem_bytes<D, 2, kFp8>()) return pick(std::integral_constant<int, 2>{}), true;
    }
    if (optin >= decode_tc_smem_bytes<D, 1, kFp8>()) return pick(std::integral_constant<int, 1>{}), true;
  }
  return false;
}

// Tensor cores with the deepest pipeline the device's shared memory holds (an fp8 cache's staging area
// included); false when none fits (then the CUDA-core template serves the call).
template <class V, class T, int D, class KV = T>
bool try_launch_decode_tc(const DecodeProblemOf<KV>& P, const typename V::Params& hp, cudaStream_t stream) {
  return with_decode_tc_stages<D, kIsFp8<KV>>(size_t(device_smem_optin()), [&](auto stages) {
    launch_decode_tc_tile<V, T, D, decltype(stages)::value, KV>(P, hp, stream);
  });
}

// Resident CTAs per SM of the tensor-core decode kernel the launcher would pick on this device
// (0 when none fits): the planner's CTA count for plan-mode grids. KV: the cache's element type.
template <class V, class T, int D, class KV = T>
int decode_tc_ctas_per_sm() {
  constexpr bool kFp8 = kIsFp8<KV>;
  int n = 0;
  with_decode_tc_stages<D, kFp8>(size_t(device_smem_optin()), [&](auto stages) {
    constexpr int S = decltype(stages)::value;
    constexpr size_t smem = decode_tc_smem_bytes<D, S, kFp8>();
    auto kernel = decode_tc_kernel_ref<V, T, D, S, KV>();
    if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, DecodeTCTile<D, S>::kThreads, smem);
  });
  return n;
}

// Whether every device a build runs on holds a tensor-core tile (the build's shared-memory floor holds the
// one-stage tile, sm_90a): then the automatic choice never falls back to the CUDA-core template, and callers
// that cannot ask for it (TVM's slots) compile none of its kernels.
template <int D, class KV>
constexpr bool decode_tc_fits_every_device() {
  return decode_tc_smem_bytes<D, 1, kIsFp8<KV>>() <= kSmemOptinFloor;
}

// Automatic choice: tensor cores (measured faster on the H200 for every group size, MHA included);
// a plan's work list and KV-head pairs are served by the tensor-core template only.
inline bool decode_wants_tensor_cores(const DecodeProblem& P) {
  return P.plan != nullptr || P.kv_head_shift != 0 || P.group_parts > 1 ||
         DecodeBackend(P.backend) != DecodeBackend::kCudaCores;
}

// MaxG: the build's max_group_size; groups above it were refused before the launch. KV: the cache's
// element type (an fp8 cache's problem carries its scales, DecodeProblemOf).
// Returns false when a plan-mode or KV-head-pair call cannot be served (no tensor-core tile fits the device).
template <class V, class T, int D, int MaxG, class KV = T>
bool launch_decode(const DecodeProblemOf<KV>& P, const typename V::Params& hp, cudaStream_t stream) {
  if (decode_wants_tensor_cores(P) && try_launch_decode_tc<V, T, D, KV>(P, hp, stream)) return true;
  if (P.plan != nullptr || P.kv_head_shift != 0 || P.group > MaxG) return false;
  if (P.group <= 1) return launch_decode_tile<V, T, D, 1, KV>(P, hp, stream), true;
  if constexpr (MaxG >= 2) if (P.group <= 2) return launch_decode_tile<V, T, D, 2, KV>(P, hp, stream), true;
  if constexpr (MaxG >= 4) if (P.group <= 4) return launch_decode_tile<V, T, D, 4, KV>(P, hp, stream), true;
  if constexpr (MaxG >= 8) launch_decode_tile<V, T, D, 8, KV>(P, hp, stream);
  return true;
}

}  // namespace attngen
