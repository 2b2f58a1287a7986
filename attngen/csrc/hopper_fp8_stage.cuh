// fp8 K/V tiles of the Hopper prefill (hopper_prefill.cuh, KV = __nv_fp8_e4m3 / __nv_fp8_e5m2): the producer
// copies a tile's rows as stored (one byte per element) into the second half of the 16-bit stage they are for,
// waits for them, and widens them in place into the query dtype's 128-byte-swizzled tile that wgmma reads,
// then fences for the async proxy and arrives on the stage's full barrier.
//
// Accuracy: the widening is exact (every e4m3 and e5m2 value is a half and a bfloat16 value, fp8_kv.cuh), so
// S = Q K^T and O += P V multiply the stored values themselves, in the query dtype's tensor-core MMAs with fp32
// accumulators, as for a 16-bit cache. The scales stay out of the tiles: k_scale joins the score scale
// (sm_scale x log2 e x k_scale[head], one fp32 product per consumer) or, for a variant with a key hook,
// multiplies the key row before the hook (the hook sees dequantised keys); v_scale joins the output rows'
// normaliser in the epilogue (fp32). That is what the mma.sync template (prefill.cuh) and the CPU backend do,
// so both templates round alike. Not taken: fp8 wgmma, which would need Q and P in fp8 (3 mantissa bits for
// e4m3, 2 for e5m2: the queries and the softmax weights rounded far below the query dtype) and a transposed V.
//
// Shared memory: none beyond the 16-bit stages. The staged bytes of a K or V tile (Keys x D) fill the upper
// half of its stage; the widening writes each staged chunk's 16-bit elements only over staged chunks at or
// before it in the staging order below, so it runs in order of that index, with a producer barrier between the
// reads and the writes of each pass that writes into the upper half (hopper_prefill_smem_bytes holds for fp8
// caches unchanged; a separate staging area would not fit at head_dim 128 with two query buffers or at 256).
//
// Staging layout: as the 16-bit tile (D / 64 column blocks of Keys rows) at half the width: row r of a block
// is 64 bytes, its 16-byte chunk c (elements 16c ... 16c + 15 of the block) at chunk c ^ ((r % 8) / 2). The
// 16-bit tile keeps those elements in its chunks 2c ^ (r % 8) and (2c + 1) ^ (r % 8), that is the 32 bytes at
// twice the staged chunk's offset, the lower 8 elements first when r is even (sw128_offset): staged chunk q
// (bytes 16q ... 16q + 15 of the staging area) widens into bytes 32q ... 32q + 31 of the stage.
#pragma once
#include <stdint.h>

#include "fp8_kv.cuh"
#include "hopper_sync.cuh"

namespace attngen {

// Byte offset in the staging area of chunk c (16 elements) of row r of a tile of `rows` rows.
__device__ __forceinline__ uint32_t staged8_offset(int r, int c, int rows) {
  return uint32_t((c / 4) * rows * 64 + r * 64 + (((c % 4) ^ ((r % 8) / 2)) << 4));
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

__device__ __forceinline__ void st_shared_v4(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// The staging area of the 16-bit stage `tile` (Keys x D elements of T): its upper half.
template <class T, int D, int Keys>
__device__ __forceinline__ void* staging_of(T* tile) {
  return reinterpret_cast<unsigned char*>(tile) + Keys * D * sizeof(T) / 2;
}

// Widens the staged fp8 tile of stage `tile` in place, by the producer's 128 threads (ptid), each of which has
// passed a producer barrier after its copies landed (every staged chunk is read by another thread). Pass p:
// staged chunks 128p ... 128p + 127, one per thread, a 16-byte load and two 16-byte stores (the 8 threads of a
// quarter warp store to 8 distinct bank groups: rows alternate which half comes first). The passes of the
// upper half overwrite staged chunks of earlier passes and of their own: barrier 1 between reads and writes.
template <class T, class KV, int D, int Keys>
__device__ __forceinline__ void widen_staged_tile(T* tile, int ptid) {
  static_assert(kIsFp8<KV> && sizeof(T) == 2 * sizeof(KV), "fp8 rows widened into 16-bit tiles");
  constexpr int kPasses = Keys * D / 16 / 128;
  static_assert(kPasses % 2 == 0 && Keys % 2 == 0, "the staged tile fills whole passes of each half");
  const uint32_t out = smem_addr(tile), staged = out + Keys * D;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int q = p * 128 + ptid;
    const uint4 raw = ld_shared_v4(staged + q * 16);
    if (p >= kPasses / 2) named_sync(1, 128);
    const uint4 lo = widen8_fp8<T, KV>(make_uint2(raw.x, raw.y));
    const uint4 hi = widen8_fp8<T, KV>(make_uint2(raw.z, raw.w));
    const uint32_t odd = uint32_t(q >> 2) & 1u;  // the row's parity (4 staged chunks per row of a block)
    st_shared_v4(out + q * 32 + odd * 16, lo);
    st_shared_v4(out + q * 32 + (odd ^ 1u) * 16, hi);
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attngen
