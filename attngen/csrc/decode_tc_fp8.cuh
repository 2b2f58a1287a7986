// The tensor-core decode over fp8 caches (decode_tc.cuh): where the loader's fp8 rows lie, their widening
// into the 16-bit scratch tile, and the half-MMA path (direct keys, half query rows).
#pragma once
#include "common.cuh"
#include "decode_tc_tile.cuh"
#include "fp8_kv.cuh"
#include "kv_tile_layout.cuh"
#include "tvm_traits.cuh"

namespace attngen {

// fp8 caches: the rows as the loader copied them, [S][2][TK][D] (direct keys: key chunks staged_key_chunk),
// where the 16-bit stages of a 16-bit cache start.
// (Only the fp8 branches name it: a pointer computed beside the 16-bit path changed that path's code.)
template <int D, int S, class KV>
__device__ __forceinline__ KV* decode_tc_staged(unsigned char* smem_raw) {
  return reinterpret_cast<KV*>(smem_raw + decode_tc_tiles_offset<D, S>());
}

// fp8 caches: this warp's rows [wk, wk + 16) of one half (0 keys, 1 values) of a staged stage, dequantised
// into the same rows of the 16-bit tile `dst` (kv_tile_at layout). A lane's loads are issued in batches
// before any of its stores: the compiler may not move a shared load above a shared store it cannot prove
// disjoint, and load -> widen -> store one chunk at a time serialised the warp on shared-memory latency.
template <class T, int D, int S, class KV>
__device__ __forceinline__ void decode_tc_widen_rows(unsigned char* smem_raw, int stage, int half, int wk, T* dst,
                                                     int lane) {
  constexpr int TK = DecodeTCTile<D, S>::kKeys;
  constexpr int CH = D / 8;                                  // 8-element chunks per row
  constexpr int PER_LANE = DecodeTCTile<D, S>::kKeysPerWarp * CH / 32;  // chunks per lane
  constexpr int BATCH = PER_LANE < 8 ? PER_LANE : 8;
  constexpr int kUnroll = D >= 256 ? 1 : PER_LANE / BATCH;  // D 256: unrolled batches spill registers
  static_assert(PER_LANE % BATCH == 0, "a lane's chunks split into whole batches");
  const KV* src = decode_tc_staged<D, S, KV>(smem_raw) + ((stage * 2 + half) * TK) * D;
#pragma unroll kUnroll
  for (int b0 = 0; b0 < PER_LANE; b0 += BATCH) {
    uint2 raw[BATCH];
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int c = lane + 32 * (b0 + i);
      raw[i] = *reinterpret_cast<const uint2*>(src + (wk + c / CH) * D + (c % CH) * 8);
    }
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int c = lane + 32 * (b0 + i);
      *reinterpret_cast<uint4*>(dst + kv_tile_at<D>(wk + c / CH, (c % CH) * 8)) = widen8_fp8<T, KV>(raw[i]);
    }
  }
  __syncwarp();
}

// fp8 caches run their MMAs on half when no hook transforms the keys: the widened keys and values are exact
// in half, the probabilities are finer in it than in bfloat16, and the query rows are scaled into its range
// (half_query_row). A key hook's output has no such bound, so it keeps the query's type.
template <class V, class KV>
constexpr bool decode_tc_half_mma() {
  return kIsFp8<KV> && !V::kHasKeyTransform && !tvm_rope<V>();
}

// Direct keys (half MMAs, S^T = K Q^T): the warps read their staged fp8 key rows into A fragments themselves,
// 16 bytes a lane, no 16-bit tile between. A lane (g, t4) reads key rows g and 8 + g, bytes [64b + 16 t4, + 16)
// of each 64-element block b, and feeds k-step 4b + s those keys' dims 64b + 16 t4 + 4s + {0, 1} and {2, 3}:
// a permutation of the dims of the dot product, which the query fragments follow
// (decode_tc_direct_qfrag), so q . k is unchanged. Rows of 128 bytes or more swap their two 64-byte halves
// on odd rows (16-byte chunk c -> c ^ 4) so the eight lanes of a 16-byte shared load hit distinct banks.
template <int D>
__device__ __forceinline__ int staged_key_chunk(int row, int chunk) {
  return D >= 128 ? chunk ^ ((row & 1) << 2) : chunk;
}

// Half query fragments for k-step k of the direct-key dims permutation, in the A layout of rows g and g + 8
// (rows g + 8 never hold a query head, so a1 = a3 = 0); S^T = K Q^T takes a0 and a2 as its B fragment
// (query g's dims 2 t4, + 1 and 8 + 2 t4, + 1 of the step).
template <int D>
__device__ __forceinline__ void decode_tc_direct_qfrag(uint32_t (&a)[4], const half* sq, int st, int k, int g,
                                                       int t4) {
  const int d0 = 64 * (k / 4) + 16 * t4 + 4 * (k % 4);
  const uint2 w = *reinterpret_cast<const uint2*>(sq + g * st + d0);
  a[0] = w.x;
  a[1] = 0u;
  a[2] = w.y;
  a[3] = 0u;
}

// One query row of T, converted to half in place (one warp): scaled by 2^-e, e >= 0 the least exponent that
// brings its largest magnitude below 2^15 (half's largest finite value is 65504; e is 0 but for rows past
// 32768, and a row holding an infinity or NaN keeps e = 0 and propagates them). 2^e goes to *up (lane 0).
template <class T, int D>
__device__ __forceinline__ void half_query_row(T* row, float* up, int lane) {
  float mx = 0.f;
  for (int i = lane; i < D; i += 32) mx = fmaxf(mx, fabsf(to_float(row[i])));
#pragma unroll
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const int e = (isfinite(mx) && mx >= 32768.f) ? ilogbf(mx) - 14 : 0;
  const float down = ldexpf(1.f, -e);
  half* out = reinterpret_cast<half*>(row);
  for (int i = lane; i < D; i += 32) out[i] = __float2half_rn(to_float(row[i]) * down);  // read, then write: one lane
  if (lane == 0) *up = ldexpf(1.f, e);
  __syncwarp();
}

}  // namespace attngen
