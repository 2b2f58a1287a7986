// The producer warpgroup of the Hopper prefill template: gathers K/V tiles from pages or ragged rows into
// 128-byte-swizzled shared memory with cp.async, applies the key transform where the variant has one,
// and hands each stage to the consumers through mbarriers.
//
// Pipeline per stage s (kStages of them): full[s] completes when all producer threads' copies of the
// tile (and the key transform) have landed; empty[s] when every consumer thread has finished reading
// it. The producer publishes tile kt - 1 as soon as its copies have landed, then waits for tile kt's stage
// to drain and issues tile kt, whose copies overlap the consumers' work on kt - 1. cp.async writes reach
// the tensor cores
// (async proxy) only after fence.proxy.async in each writing thread, before its arrival.
#pragma once
#include "cp_async.cuh"
#include "hopper_sync.cuh"
#include "kv_rows.cuh"
#include "mma.cuh"
#include "row_hook.cuh"

namespace attngen {

// The producer's view of one CTA's KV range: what to copy and where to publish it.
template <class T, int D, int Keys>
struct KVGather {
  const KVRows& kv;
  int kv_start, lo, hi, hk, page_shift;
  const T* col;  // this thread's 16-byte column of KV head hk, at key 0 of the pool

  // Copies tile kt (keys lo + kt * Keys ...) into k_dst / v_dst; rows past `hi` are zero-filled, so that
  // 0-weight (masked) products with them stay 0.
  __device__ __forceinline__ void issue(int kt, T* k_dst, T* v_dst, int ptid) const {
    constexpr int CPR = D / 8, RPP = 128 / CPR;  // 16-byte chunks per row, rows per pass of 128 threads
    static_assert(Keys % RPP == 0, "K/V rows split evenly over the producer warpgroup");
    const int c = ptid % CPR, r0 = ptid / CPR, j0 = lo + kt * Keys + r0;
    unsigned char* kb = reinterpret_cast<unsigned char*>(k_dst);
    unsigned char* vb = reinterpret_cast<unsigned char*>(v_dst);
    const T* base = static_cast<const T*>(kv.base);
#pragma unroll 1
    for (int i = 0; i < Keys / RPP; ++i) {
      const int r = r0 + i * RPP, j = j0 + i * RPP;
      const bool ok = j < hi;
      const T* src = ok ? col + kv.key_offset(kv_start, j, page_shift) : base;
      const uint32_t off = sw128_offset(r, c * 8, Keys);
      copy16_async(kb + off, src, ok);
      copy16_async(vb + off, ok ? src + kv.stride_kv : src, ok);
    }
  }
};

// The key transform on a landed K tile, by the producer's four warps (row hooks through fp32 scratch rows).
template <class V, class T, int D, int Keys>
__device__ __forceinline__ void transform_key_tile(const typename V::Params& hp, T* k_tile, int j0, int hi, int hk,
                                                   float* scratch, int pwarp, int lane) {
  unsigned char* kb = reinterpret_cast<unsigned char*>(k_tile);
  for (int r = pwarp; r < Keys; r += 4) {
    const int j = j0 + r;
    if (j >= hi) continue;
    for (int i = lane; i < D; i += 32) scratch[i] = to_float(*reinterpret_cast<T*>(kb + sw128_offset(r, i, Keys)));
    __syncwarp();
    warp_row_hook<D, V::kKeyElementwise>(
        scratch, scratch + D, [&](float* row, int i) { return V::key_elem(hp, row, i, j, hk); },
        [&](float* in, float* out) { V::key_row(hp, in, out, j, hk); }, lane);
    for (int i = lane; i < D; i += 32) *reinterpret_cast<T*>(kb + sw128_offset(r, i, Keys)) = from_float<T>(scratch[D + i]);
    __syncwarp();
  }
}

}  // namespace attngen
