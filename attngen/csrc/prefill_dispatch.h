// Which prefill template serves a call. The library's choice: the Hopper template (hopper_prefill.cuh) where
// the library was built for sm_90a (ATTNGEN_WITH_PREFILL_HOPPER) and the device has compute capability 9.0,
// else the mma.sync template (prefill.cuh); PrefillProblem::kernel forces either one (A/B runs and tests).
// Measured on the H200 (benchmarks/results/prefill_2026-11-30_hopper_pipeline.md, TFLOP/s, Hopper /
// mma.sync): head_dim 128 514-584 / 342-380, head_dim 64 394 / 267, head_dim 256 617 / 270, a ragged batch
// of short prompts 226 / 220 -- the Hopper template at every head dim.
#pragma once
#include "attngen_enums.h"
#include "hook_pass.cuh"
#include "hopper_launch.cuh"
#include "prefill_launch.cuh"

namespace attngen {

inline bool is_prefill_template(int64_t v) {
  return v == int64_t(PrefillTemplate::kAuto) || v == int64_t(PrefillTemplate::kMmaSync) ||
         v == int64_t(PrefillTemplate::kHopper);
}

// Why the template `kernel` asks for cannot serve on this device and library; nullptr when it can.
inline const char* prefill_template_problem(int kernel) {
  if (kernel == int(PrefillTemplate::kHopper) && !hopper_prefill_runs_here())
    return "the Hopper prefill template needs a library built for sm_90a and a device of compute capability 9.0";
  return nullptr;
}

template <int D>
constexpr bool hopper_prefill_preferred() {
  return D == 64 || D == 128 || D == 256;
}

// Why P's tile lists cannot serve this launch; nullptr when they can. Both templates walk them (for variants
// whose mask is not its bounds); the lists must be of the maps' tiling and the launch's grid.
template <class V, int D>
const char* tile_list_problem(const PrefillProblem& P, int max_qo_len) {
  if (!variant_maps_tiles<V>()) return "this variant's mask is its bounds: its kernels take no tile map";
  const int tiles = (max_qo_len * P.group + MapTile<D>::kRows - 1) / MapTile<D>::kRows;
  if (P.tiles.q_tiles != tiles) return "the tile map was made for another grid (max_qo_len or group)";
  return nullptr;
}

// KV: the cache's element type; fp8 caches take the same choice (both templates widen their tiles).
template <class V, class T, int D, class KV = T>
void launch_prefill_any(const PrefillProblemOf<KV>& P, int max_qo_len, const typename V::Params& hp,
                        cudaStream_t stream) {
  const bool hopper = P.kernel == int(PrefillTemplate::kHopper) ||
                      (P.kernel == int(PrefillTemplate::kAuto) && hopper_prefill_preferred<D>() && hopper_prefill_runs_here());
  if (hopper) {
    launch_hopper_prefill<V, T, D, KV>(P, max_qo_len, hp, stream);
  } else {
    launch_prefill<V, T, D, KV>(P, max_qo_len, hp, stream);
  }
}

// The automatic choice where no call can force a template (TVM's slots): a build whose every arch runs the
// Hopper template (ATTNGEN_EVERY_ARCH_WITH_PREFILL_HOPPER: its kernels run on compute capability 9.0 alone)
// takes it at every head dim it serves without compiling the mma.sync instance.
#if defined(ATTNGEN_EVERY_ARCH_WITH_PREFILL_HOPPER)
constexpr bool kHopperPrefillEverywhere = true;
#else
constexpr bool kHopperPrefillEverywhere = false;
#endif

template <class V, class T, int D, class KV = T>
void launch_prefill_auto(const PrefillProblemOf<KV>& P, int max_qo_len, const typename V::Params& hp,
                         cudaStream_t stream) {
  if constexpr (kHopperPrefillEverywhere && hopper_prefill_preferred<D>())
    launch_hopper_prefill<V, T, D, KV>(P, max_qo_len, hp, stream);
  else
    launch_prefill_any<V, T, D, KV>(P, max_qo_len, hp, stream);
}

}  // namespace attngen
