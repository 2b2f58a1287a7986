// Epilogue shared by the templates and the merge kernel: the output transform on
// final rows staged in shared memory, then the stores of O (input dtype) and lse.
#pragma once
#include "common.cuh"

namespace attngen {

// rows: [n][D] final (normalised) outputs of query heads qh0 .. qh0+n-1 of request b,
// scratch: [n][D], lse: [n]. Called by every thread of the block (flat index tid of nthreads).
// empty_lse: the lse stored for a row that saw no key (-inf; TVM's PagedKVCache expects -5e4).
template <class V, class T, int D>
__device__ __forceinline__ void finish_rows(float* rows, float* scratch, const float* lse, int n, int b,
                                            int qo_pos, int qh0, int num_qo_heads, T* o, float* o_lse,
                                            const typename V::Params& hp, int tid, int nthreads,
                                            float empty_lse = kNegInf) {
  constexpr int L = D / 8;
  const float* src = rows;
  if constexpr (V::kHasOutputTransform) {
    for (int idx = tid; idx < n * L; idx += nthreads) {
      const int r = idx / L, l = idx % L;
      if constexpr (V::kOutputElementwise) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          scratch[r * D + l * 8 + e] = V::output_elem(hp, rows + r * D, l * 8 + e, b, qo_pos, qh0 + r, lse[r]);
      } else if (l == 0) {
        V::output_row(hp, rows + r * D, scratch + r * D, b, qo_pos, qh0 + r, lse[r]);
      }
    }
    __syncthreads();
    src = scratch;
  }
  for (int idx = tid; idx < n * L; idx += nthreads) {
    const int r = idx / L, l = idx % L;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = src[r * D + l * 8 + e];
    const int64_t row = int64_t(b) * num_qo_heads + qh0 + r;
    store8(o + row * D + l * 8, v);
    if (l == 0) o_lse[row] = lse[r] == kNegInf ? empty_lse : lse[r];
  }
}

}  // namespace attngen
