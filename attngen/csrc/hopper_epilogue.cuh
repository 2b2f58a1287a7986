// The Hopper prefill consumers' epilogue (hopper_prefill.cuh): a warp's 16 rows of an item's O, held as wgmma
// accumulator fragments (rows g and g + 8 of the warp, two columns of every 8-column block per lane of the row's
// quad), normalised by their row sums, their lse (base 2), the output transform where the variant has one, stored.
#pragma once
#include "common.cuh"
#include "hopper_tile.cuh"
#include "mma.cuh"
#include "row_hook.cuh"

namespace attngen {

// Rows g and g + 8 of o_acc normalised in place from the running softmax state (m_row, d_row: this thread's
// partial sums, summed over the quad here), and their lse. kStaged: an fp8 cache (P a ScaledPrefillProblem), whose
// V scale of KV head hk the accumulated rows take here: sum_j p_j (v_j s) = s sum_j p_j v_j.
template <class V, bool kStaged, int D, class Problem>
__device__ __forceinline__ void hopper_normalise_rows(float (&o_acc)[D / 2], const float (&m_row)[2],
                                                      const float (&d_row)[2], const Problem& P, int hk,
                                                      float (&lse_row)[2]) {
  constexpr int NDT = D / 8;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float dsum = d_row[h];
    dsum += __shfl_xor_sync(0xffffffffu, dsum, 1);
    dsum += __shfl_xor_sync(0xffffffffu, dsum, 2);
    // dsum is 0 only for a row without a live key; a NaN or +inf score made it NaN, which must reach O and
    // lse (the non-finite rules of the float64 reference, as in prefill.cuh)
    float inv = (V::kSoftmax && dsum != 0.f) ? 1.f / dsum : (V::kSoftmax ? 0.f : 1.f);
    if constexpr (kStaged) inv *= P.scales.v_of(hk);
#pragma unroll
    for (int n = 0; n < NDT; ++n) {
      o_acc[4 * n + 2 * h] *= inv;
      o_acc[4 * n + 2 * h + 1] *= inv;
    }
    lse_row[h] = V::kSoftmax ? (dsum != 0.f ? m_row[h] + log2f(dsum) : kNegInf) : 0.f;
  }
}

// Stores the warp's normalised rows (its first row in the tile: wrow; the thread's: wrow + g and + 8) and their
// lse, through the output transform where the variant has one. stripe >= 0 (a tail split's spread merge, no output
// transform: hopper_tail.cuh): only the rows' columns 16 stripe .. 16 stripe + 15, the lse with stripe 0.
template <class V, class T, int D, class Problem>
__device__ __forceinline__ void hopper_store_rows(const float (&o_acc)[D / 2], const float (&lse_row)[2],
                                                  const HopperItem& w, int wrow, const Problem& P,
                                                  const typename V::Params& hp, float* scratch, int lane,
                                                  int stripe = -1) {
  constexpr int NDT = D / 8;
  const int g = lane / 4, t4 = lane % 4, group = P.group, hk = w.hk, q0 = w.q0, rows_total = w.rows_total;
  if constexpr (!V::kHasOutputTransform) {
    // each row's fragments (two columns of every 8-column block per lane of its quad) regrouped within the quad
    // so that a lane stores whole 8-column blocks in 16 bytes: a quarter of the store instructions, each
    // touching a row's 64 contiguous bytes instead of 4 (quad_transpose; every lane shuffles, valid row or not)
    static_assert(NDT % 4 == 0, "the quad's blocks of four 8-column blocks");
    // (a stripe: 8-column blocks 2 stripe and 2 stripe + 1, which lanes t4 of its half of the quad store)
    const bool mine = stripe < 0 || (t4 >> 1) == (stripe & 1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pr = w.row0 + wrow + g + 8 * h;
      const bool valid = pr < rows_total && mine;
      const int tok = q0 + pr / group, qh = hk * group + pr % group;
      T* dst = static_cast<T*>(P.o) + (int64_t(tok) * P.num_qo_heads + qh) * D;
#pragma unroll
      for (int m = 0; m < NDT / 4; ++m) {
        if (stripe >= 0 && m != stripe / 2) continue;  // (warp-uniform)
        uint32_t wd[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          wd[j] = pack2<T>(o_acc[4 * (4 * m + j) + 2 * h], o_acc[4 * (4 * m + j) + 2 * h + 1]);
        quad_transpose(wd, t4);
        if (valid) *reinterpret_cast<uint4*>(dst + (4 * m + t4) * 8) = make_uint4(wd[0], wd[1], wd[2], wd[3]);
      }
      const float l = lse_row[h];
      if (valid && t4 == 0 && stripe <= 0)
        P.lse[int64_t(tok) * P.num_qo_heads + qh] = l == kNegInf ? P.empty_lse() : l;
    }
  } else {
    // one row of the warp's 16 at a time through the warp's scratch rows: the quad holding it writes its
    // fragments, the warp applies the hook and stores the row. The fragment half h (rows g, g + 8) is the
    // unrolled outer loop: o_acc indexed by a run-time h would put the accumulators in local memory.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll 1
      for (int r8 = 0; r8 < 8; ++r8) {
        const int pr = w.row0 + wrow + 8 * h + r8;
        if (pr >= rows_total) break;  // (warp-uniform; the rows of h = 1 lie past those of h = 0)
        if (g == r8) {
#pragma unroll
          for (int n = 0; n < NDT; ++n) {
            scratch[n * 8 + t4 * 2] = o_acc[4 * n + 2 * h];
            scratch[n * 8 + t4 * 2 + 1] = o_acc[4 * n + 2 * h + 1];
          }
        }
        const float l = __shfl_sync(0xffffffffu, lse_row[h], r8 * 4);
        __syncwarp();
        const int tok = q0 + pr / group, qh = hk * group + pr % group, qo_pos = w.pos_base + pr / group, b = w.b;
        warp_row_hook<D, V::kOutputElementwise>(
            scratch, scratch + D, [&](float* row, int i) { return V::output_elem(hp, row, i, b, qo_pos, qh, l); },
            [&](float* in, float* out) { V::output_row(hp, in, out, b, qo_pos, qh, l); }, lane);
        T* dst = static_cast<T*>(P.o) + (int64_t(tok) * P.num_qo_heads + qh) * D;
        for (int i = lane; i < D; i += 32) dst[i] = from_float<T>(scratch[D + i]);
        if (lane == 0) P.lse[int64_t(tok) * P.num_qo_heads + qh] = l == kNegInf ? P.empty_lse() : l;
        __syncwarp();
      }
    }
  }
}

}  // namespace attngen
