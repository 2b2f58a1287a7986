// The Hopper prefill's tiling (hopper_prefill.cuh): the CTA's warpgroups, rows and keys per tile, pipeline
// stages and register split, its shared memory, and the work item a persistent CTA decodes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tile_map.cuh"
#include "trait_flag.h"
#include "tvm_traits.cuh"

namespace attngen {

// Wide: 176 keys per K/V tile and one query buffer at D 128, 192 keys and two query buffers at D 64
// (hopper_wide_tiles says for which kernels), else 128 keys (64 at D 256) with two query buffers where shared
// memory holds them.
// Of every 16 softmax weights of a consumer's tile, how many poly_exp2 (poly_exp2.h) computes on the FMA pipe
// instead of MUFU.EX2: where MUFU, not the tensor cores, bounds the tile: at head dim 64 (S and P V of a tile
// take about as long on the tensor cores as its 2^x on MUFU) and where the logits hook makes special-function
// calls of its own per score (sfu_calls: soft-cap's tanh)
template <int D>
constexpr int hopper_poly_exp2_of_16(int sfu_calls) {
  return sfu_calls > 0 ? 0 : (D == 64 ? 2 : 0);
}

template <int D, bool Wide = false>
struct HopperTile {
  static_assert(D == 64 || D == 128 || D == 256, "the Hopper prefill supports head_dim 64, 128, 256");
  static_assert(!Wide || D <= 128, "wide tiles are a head_dim 64 and 128 tiling");
  static constexpr int kConsumers = 2;              // consumer warpgroups of 64 rows
  static constexpr int kRows = 64 * kConsumers;     // packed query rows per CTA
  // keys per K/V tile (S: 64 x kKeys per consumer). Wide where nothing checks scores: the softmax's fixed work
  // per tile (row reductions, barriers, the rescale test) spreads over more keys; 176 at D 128, where S (88), P
  // (44) and O (64 registers) still fit a consumer's 232, 192 at D 64 (S 96, P 48, O 32), whose tiles are half
  // as long to compute, so that the fixed work weighs twice as much
  static constexpr int kKeys = Wide ? (D == 64 ? 192 : 176) : D == 256 ? 64 : 128;
  // K / V stages: three at D 64, whose tiles are half as long to compute as they are to load at D 128
  static constexpr int kStages = D == 64 ? 3 : 2;
  // query tiles in flight: two where shared memory holds them (the next item's rows land during this
  // item's epilogue), one at D 256 and with D 128's wide tiles (two stages of 176-key K and V tiles take 176 KiB;
  // D 64's three stages of 192 keys take 144 KiB)
  static constexpr int kQBuffers = D == 64 || (D == 128 && !Wide) ? 2 : 1;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // 128 * (producer + 2 * consumer) <= 384 * 168 registers: what the CTA holds at launch (__launch_bounds__(384, 1)
  // caps a thread at 168); setmaxnreg.inc waits until the registers it asks for are free, so a split summing to
  // the SM's whole 64K never starts its consumers. At D 256 the consumers' 64 x 256 accumulators take 8 more
  // (ptxas: 56 / 88 bytes of spill stores / loads with 40 / 232)
  static constexpr int kProducerRegs = D == 256 ? 24 : 40, kConsumerRegs = D == 256 ? 240 : 232;
  static constexpr int kRegsPerThreadRow = 384 * 168 / 128;  // 504: producer + 2 x consumer at most
  static_assert(Wide || (kRows == MapTile<D>::kRows && kKeys == MapTile<D>::kKeys), "tile maps are made in this tiling");
};

template <class V>
using HopperWideTilesFlag = std::bool_constant<V::kHopperWideTiles>;

// Whether a kernel runs wide tiles: where the variant's traits ask for them (kHopperWideTiles, from
// schedules/template_prefill_hopper.py hopper_config_for: head_dim 64 or 128, and no per-score checks beyond the key
// range or per-tile producer work: no mask hook, the run-time causal flag may still bound the range; no key
// transform, so never a tile map), over 16-bit K/V (an fp8 cache's staging keeps the 128-key tiles), and outside
// TVM's conventions.
template <class V, class T, class KV>
constexpr bool hopper_wide_tiles() {
  return trait_flag<V, HopperWideTilesFlag>() && std::is_same_v<KV, T> && !tvm_instance<V>();
}

template <class V>
using HopperWideLongRowsFlag = std::bool_constant<V::kHopperWideLongRows>;

// The query rows of a call's longest request from which a launch takes wide tiles where a variant has both
// tilings (hopper_wide_choice). On the H200 (2026-12-05, A/B against one tiling each, two alternating runs,
// ab_trees_2026-12-05_hopper_two_tilings.md): with wide tiles from 4096 rows, causal L 16k 623 -> 644 TFLOP/s and
// causal L 8k (fp16) 644 -> 654, but causal L 4k 626 -> 620; a ragged batch of 64-1024-row prompts stays on 128
// keys (375 / 376); full attention L 8k, wide in both, 653 / 655. A request's last key tile and the diagonal waste
// more of a wider tile when rows are few: so from 8192 rows.
constexpr int kHopperWideRows = 8192;

// Whether a kernel has both tilings, the launch choosing by kHopperWideRows: a variant whose mask hook is exactly
// its bounds (kHopperWideLongRows: causal, sliding window), over 16-bit K/V, outside TVM's conventions. The
// wide-tiled variants above (no mask hook) run their wide tiling (176 keys at D 128, 192 at D 64) at every length,
// as before the choice existed (short calls of theirs on 128 keys are not measured). ATTNGEN_HOPPER_ONE_TILING
// (linked builds that defer alternatives, codegen/lto.py ONE_TILING_DEFINE): every kernel keeps its one tiling
// (hopper_wide_tiles), so that an edit links one kernel.
template <class V, class T, class KV>
constexpr bool hopper_wide_choice() {
#if defined(ATTNGEN_HOPPER_ONE_TILING)
  return false;
#else
  // (the flag is set at head dims 64 and 128 alone, never with kHopperWideTiles: one needs a mask hook, the other none)
  return trait_flag<V, HopperWideLongRowsFlag>() && std::is_same_v<KV, T> && !tvm_instance<V>();
#endif
}

// The register split of a variant's kernel. A key hook runs in the producer (hopper_producer.cuh
// transform_key_tile), where 40 registers spilled RoPE's rows (ptxas: 208 / 376 bytes of spill stores / loads
// at D 128); with a key hook the producer gets 96 registers (72 at D 256, whose consumers hold 64 x 256
// accumulators) and the consumers what is left of the SM's 64K (RoPE: 4 / 4 bytes at D 128, 0 at D 64).
template <class V, int D>
constexpr int hopper_producer_regs() {
  return V::kHasKeyTransform ? (D == 256 ? 72 : 96) : HopperTile<D>::kProducerRegs;
}
template <class V, int D>
constexpr int hopper_consumer_regs() {  // 128 threads per warpgroup, setmaxnreg counts in multiples of 8
  return V::kHasKeyTransform ? (HopperTile<D>::kRegsPerThreadRow - hopper_producer_regs<V, D>()) / 2 / 8 * 8
                             : HopperTile<D>::kConsumerRegs;
}

// One work item of a persistent CTA, as the producer decodes it (hopper_prefill_kernel's item_at) and
// hands it to the consumers in shared memory beside the item's query rows.
// The tail split's section behind the work order (hopper_tail.cuh): its header's ints, its magic, a piece's end
// tile that means the item's last, and the most pieces a CTA takes
constexpr int kTailHeader = 12, kTailMagic = 0x7A11, kTailToEnd = 0x7fffffff, kTailMaxPieces = 8;

struct HopperItem {
  int b, tile, hk, q0, rows_total, row0, pos_base;  // request, query tile, KV head, rows
  int lo, hi, num_kt;                               // the visible key range and its tiles
  const int32_t* tile_list;                         // mapped: the tile map's list of the item's key tiles
};

// An item read from shared memory, every field broadcast from lane 0: the compiler then knows the item (and
// every bound and branch derived from it, the mainloop's included) is warp-uniform, as it knew of the item
// each consumer had decoded from global memory, and keeps the asynchronous MMAs in flight.
__device__ __forceinline__ HopperItem warp_uniform_item(const HopperItem& in) {
  HopperItem w;
  w.b = __shfl_sync(0xffffffffu, in.b, 0);
  w.tile = __shfl_sync(0xffffffffu, in.tile, 0);
  w.hk = __shfl_sync(0xffffffffu, in.hk, 0);
  w.q0 = __shfl_sync(0xffffffffu, in.q0, 0);
  w.rows_total = __shfl_sync(0xffffffffu, in.rows_total, 0);
  w.row0 = __shfl_sync(0xffffffffu, in.row0, 0);
  w.pos_base = __shfl_sync(0xffffffffu, in.pos_base, 0);
  w.lo = __shfl_sync(0xffffffffu, in.lo, 0);
  w.hi = __shfl_sync(0xffffffffu, in.hi, 0);
  w.num_kt = __shfl_sync(0xffffffffu, in.num_kt, 0);
  w.tile_list = reinterpret_cast<const int32_t*>(
      __shfl_sync(0xffffffffu, reinterpret_cast<long long>(in.tile_list), 0));
  return w;
}

// A 4 x 4 transpose of 32-bit words within each quad of lanes (t4 = lane % 4): afterwards word j of lane t4
// is what word t4 of lane j was. Two butterfly rounds (lanes t4 ^ 2, then t4 ^ 1), two shuffles each; every
// lane of the warp takes part.
__device__ __forceinline__ void quad_transpose(uint32_t (&a)[4], int t4) {
  const bool hi2 = (t4 & 2) != 0;  // lanes 2, 3 trade their words 0, 1 for words 2, 3 of lanes 0, 1
  uint32_t r0 = __shfl_xor_sync(0xffffffffu, hi2 ? a[0] : a[2], 2);
  uint32_t r1 = __shfl_xor_sync(0xffffffffu, hi2 ? a[1] : a[3], 2);
  a[0] = hi2 ? r0 : a[0];
  a[1] = hi2 ? r1 : a[1];
  a[2] = hi2 ? a[2] : r0;
  a[3] = hi2 ? a[3] : r1;
  const bool hi1 = (t4 & 1) != 0;  // odd lanes trade their words 0, 2 for words 1, 3 of even lanes
  r0 = __shfl_xor_sync(0xffffffffu, hi1 ? a[0] : a[1], 1);
  r1 = __shfl_xor_sync(0xffffffffu, hi1 ? a[2] : a[3], 1);
  a[0] = hi1 ? r0 : a[0];
  a[2] = hi1 ? r1 : a[2];
  a[1] = hi1 ? a[1] : r0;
  a[3] = hi1 ? a[3] : r1;
}

// Shared memory: [alignment slack][Q: kQBuffers x kRows x D][K: kStages x kKeys x D][V: same][scratch fp32
// rows, two of D per warp][paged row addresses: 2 x kKeys][full_k, empty_k, full_v, empty_v mbarriers,
// kStages each][full_q, empty_q mbarriers, kQBuffers each][the work item of each Q buffer][the CTA's pieces of a
// tail split, kTailMaxPieces int4, and their count with the tail's offsets in 16 bytes (hopper_tail_at)].
// Tiles start 1024-byte aligned (the swizzle's period). T: the query dtype, whatever the cache's: an fp8 cache's
// rows are staged in the upper half of their K / V stage and widened there (hopper_fp8_stage.cuh).
template <class T, int D, bool Wide = false>
constexpr size_t hopper_prefill_smem_bytes() {
  using Tile = HopperTile<D, Wide>;
  return 1024 + size_t(Tile::kQBuffers) * Tile::kRows * D * sizeof(T) +
         2 * size_t(Tile::kStages) * Tile::kKeys * D * sizeof(T) + size_t(Tile::kThreads / 32) * 2 * D * sizeof(float) +
         2 * Tile::kKeys * sizeof(int64_t) + 4 * Tile::kStages * sizeof(uint64_t) + 2 * Tile::kQBuffers * sizeof(uint64_t) +
         Tile::kQBuffers * sizeof(HopperItem) + (kTailMaxPieces + 1) * 16;
}

}  // namespace attngen
