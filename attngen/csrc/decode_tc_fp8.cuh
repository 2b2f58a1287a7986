// The tensor-core decode over fp8 caches (decode_tc.cuh): where the loader's fp8 rows lie, their widening
// into 16-bit rows, and the half-MMA path (direct keys, half query rows, the transposed scores' softmax).
#pragma once
#include "common.cuh"
#include "decode_tc_tile.cuh"
#include "fp8_kv.cuh"
#include "kv_tile_layout.cuh"
#include "mma.cuh"
#include "tvm_traits.cuh"

namespace attngen {

// fp8 caches: the rows as the loader copied them, [S][2][TK][D] (direct keys: key chunks staged_key_chunk),
// where the 16-bit stages of a 16-bit cache start.
// (Only the fp8 branches name it: a pointer computed beside the 16-bit path changed that path's code.)
template <int D, int S, class KV>
__device__ __forceinline__ KV* decode_tc_staged(unsigned char* smem_raw) {
  return reinterpret_cast<KV*>(smem_raw + decode_tc_tiles_offset<D, S, true>());
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

// Direct values (half MMAs at D 64 and 128, O^T += V^T P^T): the warps read their staged fp8 value rows into A
// fragments themselves, with no widened 16-bit tile and no ldmatrix between. Lane (g, t4) owns dims
// [D/8 g, D/8 g + D/8) of every value row (8 or 16 bytes) and reads them from keys 2 t4, 2 t4 + 1, 2 t4 + 8 and
// 2 t4 + 9 (the k columns of its A fragments); a byte permute pairs each dim's two keys, one conversion widens a
// pair. M-tile i's rows g and g + 8 are the lane's dims D/8 g + 2 i and + 1 (decode_tc_direct_value_dim), a
// permutation of O^T's rows that the epilogue undoes. The value rows lie swizzled (staged_value_at) so that the
// lanes of one shared load, which read four rows 2 t4 (+ 1, + 8, + 9), hit distinct banks.
template <int D>
constexpr bool decode_tc_direct_values() {
  return D == 64 || D == 128;
}

// Byte offset, in a stage's value half, of byte col (a multiple of 8) of value row `row` under direct values.
// D 128 (128-byte rows, a 16-byte load per row): chunk c at c ^ 2 ((row / 2) % 4), the eight lanes of a load
// phase (two chunks of four rows) on eight chunk columns. D 64 (64-byte rows, an 8-byte load per row, sixteen
// lanes a phase): rows 4-7 of every 8 swap odd and even (row ^ 1), so two of the four rows of a phase lie in each
// 64-byte half of the banks, and chunk c at c ^ 2 ((row / 2) % 2) puts those two rows' bytes on different banks.
template <int D>
__device__ __forceinline__ int staged_value_at(int row, int col) {
  static_assert(decode_tc_direct_values<D>(), "direct values at D 64 and 128");
  if constexpr (D == 64) {
    return (row ^ ((row >> 2) & 1)) * D + (((col >> 4) ^ (((row >> 1) & 1) << 1)) << 4) + (col & 15);
  } else {
    return row * D + (((col >> 4) ^ (((row >> 1) & 3) << 1)) << 4) + (col & 15);
  }
}

// the output dim of row g + 8 h (h = 0, 1) of O^T's m-tile i under direct values
template <int D>
__device__ __forceinline__ int decode_tc_direct_value_dim(int i, int g, int h) {
  return (D / 8) * g + 2 * i + h;
}

// O^T += V^T P^T over a warp's 16 keys (stage rows wk .. wk + 15), the fp8 value rows straight into A fragments;
// b0, b1: P^T's B fragment (keys 2 t4, + 1 and 8 + 2 t4, + 1 of query row g)
template <int D, int S, class KV>
__device__ __forceinline__ void decode_tc_direct_pv(float (&o_acc)[D / 16][4], unsigned char* smem_raw, int stage,
                                                    int wk, int g, int t4, uint32_t b0, uint32_t b1) {
  constexpr int TK = DecodeTCTile<D, S>::kKeys;
  constexpr int W = D / 32;  // 32-bit words of a lane's D / 8 dims
  const unsigned char* vrows =
      reinterpret_cast<const unsigned char*>(decode_tc_staged<D, S, KV>(smem_raw)) + (size_t(stage) * 2 + 1) * TK * D;
  const int r0 = wk + 2 * t4;
  uint32_t w[4][W];  // keys 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9: the lane's D / 8 dims
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const unsigned char* at = vrows + staged_value_at<D>(r0 + (k & 1) + 8 * (k >> 1), (D / 8) * g);
    if constexpr (W == 4) {
      const uint4 v = *reinterpret_cast<const uint4*>(at);
      w[k][0] = v.x, w[k][1] = v.y, w[k][2] = v.z, w[k][3] = v.w;
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(at);
      w[k][0] = v.x, w[k][1] = v.y;
    }
  }
#pragma unroll
  for (int q = 0; q < W; ++q) {  // word q: dims D/8 g + 4 q .. + 3, m-tiles 2 q and 2 q + 1
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const uint32_t sel = m ? 0x7362u : 0x5140u;  // each dim's bytes of the two keys side by side
      const uint32_t lo = __byte_perm(w[0][q], w[1][q], sel), hi = __byte_perm(w[2][q], w[3][q], sel);
      const uint32_t a[4] = {fp8x2_to_half2_bits<KV>(lo & 0xffffu), fp8x2_to_half2_bits<KV>(lo >> 16),
                             fp8x2_to_half2_bits<KV>(hi & 0xffffu), fp8x2_to_half2_bits<KV>(hi >> 16)};
      mma16816<half>(o_acc[2 * q + m], a, b0, b1);
    }
  }
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

// S^T = K Q^T over a warp's 16 keys (rows wk .. wk + 15 of the stage): the staged fp8 key rows straight into
// A fragments (keys g and 8 + g), the query rows as the B fragment (its 8 columns: at most 8 heads), so no MMA
// row is padding. st: [key g | 8 + g][query row 2 t4 | 2 t4 + 1]. qfrag: the query's fragments
// (decode_tc_direct_qfrag) where they fit in registers (NQ = D / 16), else (NQ = 1) read from its shared
// rows sq (stride st_q) per k-step.
template <int D, int S, class KV, int NQ>
__device__ __forceinline__ void decode_tc_direct_scores(float (&st)[4], unsigned char* smem_raw, int stage, int wk,
                                                        int g, int t4, const uint32_t (&qfrag)[NQ][4],
                                                        const half* sq, int st_q) {
  constexpr int TK = DecodeTCTile<D, S>::kKeys;
  constexpr bool kQInRegs = NQ == D / 16;
  const KV* krows = decode_tc_staged<D, S, KV>(smem_raw) + size_t(stage) * 2 * TK * D;
  // two accumulators, even and odd k-steps: two chains of D / 32 dependent MMAs in place of one of D / 16, whose
  // fixed latency the warp waits out (the fp8 decode's largest stall, ncu_decode_2026-12-07_h100.md)
  float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  const int r0 = wk + g, r1 = wk + 8 + g;
#pragma unroll
  for (int blk = 0; blk < D / 64; ++blk) {
    const uint4 w0 = *reinterpret_cast<const uint4*>(krows + r0 * D + staged_key_chunk<D>(r0, 4 * blk + t4) * 16);
    const uint4 w1 = *reinterpret_cast<const uint4*>(krows + r1 * D + staged_key_chunk<D>(r1, 4 * blk + t4) * 16);
    const uint32_t lo[4] = {w0.x, w0.y, w0.z, w0.w}, hi[4] = {w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int s4 = 0; s4 < 4; ++s4) {
      const uint32_t ka[4] = {fp8x2_to_half2_bits<KV>(lo[s4] & 0xffffu), fp8x2_to_half2_bits<KV>(hi[s4] & 0xffffu),
                              fp8x2_to_half2_bits<KV>(lo[s4] >> 16), fp8x2_to_half2_bits<KV>(hi[s4] >> 16)};
      if constexpr (kQInRegs) {
        mma16816<half>(acc[s4 & 1], ka, qfrag[4 * blk + s4][0], qfrag[4 * blk + s4][2]);
      } else {  // (D 256: the query's B fragment from its shared row, two words)
        uint32_t qb[4];
        decode_tc_direct_qfrag<D>(qb, sq, st_q, 4 * blk + s4, g, t4);
        mma16816<half>(acc[s4 & 1], ka, qb[0], qb[2]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) st[i] = acc[0][i] + acc[1][i];
}

// The online softmax of the transposed scores (decode_tc_direct_scores, hooks applied; mt2: the tile's running
// maxima of query rows 2 t4 + c over this thread's keys): the states m2 / d2, st turned into probabilities, and
// the accumulator O^T (NOA m-tiles whose columns are the same query rows). A row's maximum m2 moves only when some
// lane's scores exceed it by more than kRescaleSlack (common.cuh, as the prefill templates' row maxima do): one
// vote of the warp in place of the rows' reductions over the warp's 16 keys (lanes of one t4), which run only on
// such a rise, rescaling d2 and O^T where a row's maximum grew. The weights then stay below 2^kRescaleSlack (exact
// in half P as relatively fine as below 1), and the state (m2, d2, O^T) stays exact: m2 is the offset the weights
// were taken against. A NaN score counts as a rise, so that the reductions carry it into m2.
template <int NOA>
__device__ __forceinline__ void direct_online_softmax(float (&st)[4], float (&mt2)[2], float (&m2)[2], float (&d2)[2],
                                                      float (&o_acc)[NOA][4]) {
  // (the difference, exact for nearby values where m2 + kRescaleSlack would round at large |m2|; -inf - -inf, an
  // all-masked or padding row, is NaN and no rise; a NaN score is one)
  bool rise = false;
#pragma unroll
  for (int c = 0; c < 2; ++c) rise = rise || mt2[c] - m2[c] > kRescaleSlack || isnan(mt2[c]);
  if (__any_sync(0xffffffffu, rise)) {  // (uniform across the warp: the shuffles below see every lane)
    float rescale2[2];
    bool grew = false;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int o = 4; o < 32; o *= 2) mt2[c] = fmax_nan(mt2[c], __shfl_xor_sync(0xffffffffu, mt2[c], o));
      const bool up = mt2[c] != m2[c];
      rescale2[c] = up ? fast_exp2(m2[c] - mt2[c]) : 1.f;
      d2[c] *= rescale2[c];
      m2[c] = mt2[c];
      grew = grew || up;
    }
    if (grew) {
#pragma unroll
      for (int i = 0; i < NOA; ++i) {
        o_acc[i][0] *= rescale2[0];
        o_acc[i][1] *= rescale2[1];
        o_acc[i][2] *= rescale2[0];
        o_acc[i][3] *= rescale2[1];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float p = m2[i & 1] != kNegInf ? fast_exp2(st[i] - m2[i & 1]) : 0.f;
    st[i] = p;
    d2[i & 1] += p;
  }
}

}  // namespace attngen
