// The Hopper prefill consumers' epilogue (hopper_prefill.cuh): a warp's 16 rows of O, held as wgmma
// accumulator fragments (rows g and g + 8 of the warp, two columns of every 8-column block per lane of the
// row's quad), normalised by the row sums, their lse (base 2), the output transform, stored.
//
// finish_rows takes what the store needs from the softmax state alone (the rows' 1 / sum and lse), so that a
// consumer can store the rows later: with two query buffers (D <= 128) and no output hook, the consumer packs
// an item's rows (pack_rows), issues the next item's S = Q K^T and stores them while that runs on the tensor
// cores (store_packed).
#pragma once
#include "common.cuh"
#include "hopper_tile.cuh"
#include "mma.cuh"
#include "row_hook.cuh"

namespace attngen {

// One warp's output rows of an item: the thread's rows prow0 and prow0 + 8, and what storing them needs.
struct HopperOutRows {
  float inv[2], lse[2];  // 1 / row sum (times an fp8 cache's V scale), lse base 2 (-inf: no visible key)
  int b, hk, q0, rows_total, pos_base, wrow_first, prow0;  // request, KV head, rows; the warp's first row
};

// The rows' normalisation and lse from the running softmax state (m_row, d_row: this thread's partial sums
// of rows g and g + 8, summed over the quad here). v_scale: an fp8 cache's V scale (1 otherwise).
template <class V>
__device__ __forceinline__ void finish_rows(const float (&m_row)[2], const float (&d_row)[2], float v_scale,
                                            HopperOutRows& out) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float dsum = d_row[h];
    dsum += __shfl_xor_sync(0xffffffffu, dsum, 1);
    dsum += __shfl_xor_sync(0xffffffffu, dsum, 2);
    // dsum is 0 only for a row without a live key; a NaN or +inf score made it NaN, which must reach O and
    // lse (the non-finite rules of the float64 reference, as in prefill.cuh)
    out.inv[h] = ((V::kSoftmax && dsum != 0.f) ? 1.f / dsum : (V::kSoftmax ? 0.f : 1.f)) * v_scale;
    out.lse[h] = V::kSoftmax ? (dsum != 0.f ? m_row[h] + log2f(dsum) : kNegInf) : 0.f;
  }
}

// A deferred store's rows, normalised and packed to T (words [h][m][j]: row g + 8 h, 8-column block 4 m + j, the
// lane's two columns of it), so that they wait in D / 4 registers that no wgmma defined: ptxas injects a wait
// for every wgmma in flight before a read of registers a wgmma wrote, however long ago.
template <class T, int D>
__device__ __forceinline__ void pack_rows(const float (&o_acc)[D / 2], const HopperOutRows& out,
                                          uint32_t (&opk)[D / 4]) {
  constexpr int NDT = D / 8;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int n = 0; n < NDT; ++n)
      opk[h * NDT + n] = pack2<T>(o_acc[4 * n + 2 * h] * out.inv[h], o_acc[4 * n + 2 * h + 1] * out.inv[h]);
}

// Stores packed rows and their lse: each row's words regrouped within the quad so that a lane stores whole
// 8-column blocks in 16 bytes (a quarter of the store instructions, each touching a row's 64 contiguous bytes
// instead of 4; quad_transpose: every lane shuffles, valid row or not).
template <class T, int D, class Problem>
__device__ __forceinline__ void store_packed(const uint32_t (&opk)[D / 4], const HopperOutRows& out,
                                             const Problem& P, int lane) {
  constexpr int NDT = D / 8;
  static_assert(NDT % 4 == 0, "the quad's blocks of four 8-column blocks");
  const int t4 = lane % 4, group = P.group;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int pr = out.prow0 + 8 * h;
    const bool valid = pr < out.rows_total;
    const int tok = out.q0 + pr / group, qh = out.hk * group + pr % group;
    T* dst = static_cast<T*>(P.o) + (int64_t(tok) * P.num_qo_heads + qh) * D;
#pragma unroll
    for (int m = 0; m < NDT / 4; ++m) {
      uint32_t w[4] = {opk[h * NDT + 4 * m], opk[h * NDT + 4 * m + 1], opk[h * NDT + 4 * m + 2],
                       opk[h * NDT + 4 * m + 3]};
      quad_transpose(w, t4);
      if (valid) *reinterpret_cast<uint4*>(dst + (4 * m + t4) * 8) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    const float l = out.lse[h];
    if (valid && t4 == 0) P.lse[int64_t(tok) * P.num_qo_heads + qh] = l == kNegInf ? P.empty_lse() : l;
  }
}

// Stores the rows of `out` from the accumulators o_acc, their lse, through the output transform where the
// variant has one (one row of the warp's 16 at a time through the warp's scratch rows).
template <class V, class T, int D, class Problem>
__device__ __forceinline__ void store_rows(const float (&o_acc)[D / 2], const HopperOutRows& out, const Problem& P,
                                           const typename V::Params& hp, float* scratch, int lane) {
  constexpr int NDT = D / 8;
  const int g = lane / 4, t4 = lane % 4, group = P.group;
  if constexpr (!V::kHasOutputTransform) {
    uint32_t opk[D / 4];
    pack_rows<T, D>(o_acc, out, opk);
    store_packed<T, D>(opk, out, P, lane);
  } else {
    // the quad holding row rr writes its fragments to the scratch row, the warp applies the hook and stores it
#pragma unroll 1
    for (int rr = 0; rr < 16; ++rr) {
      const int pr = out.wrow_first + rr;
      if (pr >= out.rows_total) break;
      const int h = rr / 8;
      if (g == rr % 8) {
#pragma unroll
        for (int n = 0; n < NDT; ++n) {
          scratch[n * 8 + t4 * 2] = o_acc[4 * n + 2 * h] * out.inv[h];
          scratch[n * 8 + t4 * 2 + 1] = o_acc[4 * n + 2 * h + 1] * out.inv[h];
        }
      }
      const float l = __shfl_sync(0xffffffffu, out.lse[h], (rr % 8) * 4);
      __syncwarp();
      const int tok = out.q0 + pr / group, qh = out.hk * group + pr % group, qo_pos = out.pos_base + pr / group;
      const int b = out.b;
      warp_row_hook<D, V::kOutputElementwise>(
          scratch, scratch + D, [&](float* row, int i) { return V::output_elem(hp, row, i, b, qo_pos, qh, l); },
          [&](float* in, float* o) { V::output_row(hp, in, o, b, qo_pos, qh, l); }, lane);
      T* dst = static_cast<T*>(P.o) + (int64_t(tok) * P.num_qo_heads + qh) * D;
      for (int i = lane; i < D; i += 32) dst[i] = from_float<T>(scratch[D + i]);
      if (lane == 0) P.lse[int64_t(tok) * P.num_qo_heads + qh] = l == kNegInf ? P.empty_lse() : l;
      __syncwarp();
    }
  }
}

}  // namespace attngen
