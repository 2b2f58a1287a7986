// Merge the partial states of split-KV chunks: softmax states by their base-2 lse,
// sum states by addition; an empty chunk (lse = -inf) contributes nothing and two
// empty states stay empty (O = 0, lse = -inf), never NaN. The output transform runs
// here, once, on the merged row.
#pragma once
#include "common.cuh"
#include "decode.cuh"
#include "epilogue.cuh"

namespace attngen {

// grid (num_qo_heads, B), block D/8 threads; part_o [B, C, Hq, D], part_lse [B, C, Hq]; in plan mode
// grid (num_qo_heads, max merges) and part_o [slots, Hq, D], part_lse [slots, Hq]
template <class V, class T, int D>
__global__ void merge_decode_kernel(DecodeProblem P, typename V::Params hp) {
  constexpr int L = D / 8;
  __shared__ float rows[2 * D];
  __shared__ float lse_s[1];
  const int h = blockIdx.x, l = threadIdx.x;
  // plan mode: block y is a merge tile of the plan (blocks past the plan's count exit); else request y
  int b = blockIdx.y, count = P.num_chunks;
  const int32_t* slots = nullptr;
  if (P.plan != nullptr) {
    const DecodePlanView plan(P.plan);
    if (int(blockIdx.y) >= plan.num_merges) return;
    b = plan.merge_tiles[2 * blockIdx.y];
    slots = plan.merge_partials + plan.merge_indptr[blockIdx.y];
    count = plan.merge_indptr[blockIdx.y + 1] - plan.merge_indptr[blockIdx.y];
  }
  float m = kNegInf, den = 0.f, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int c = 0; c < count; ++c) {
    const int64_t r = (slots ? int64_t(slots[c]) : int64_t(b) * P.num_chunks + c) * P.num_qo_heads + h;
    const float lc = P.part_lse[r];
    const float4* src = reinterpret_cast<const float4*>(P.part_o + r * D + l * 8);
    float4 x = src[0], y = src[1];
    float oc[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
    if constexpr (V::kSoftmax) {
      MergeScales ms = merge_scales(m, lc);
      den = den * ms.a + ms.b;  // a partial row is normalised: its own denominator is 1 at scale 2^lc
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = acc[e] * ms.a + oc[e] * ms.b;
      m = ms.m;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] += oc[e];
    }
  }
  float lse = 0.f;
  if constexpr (V::kSoftmax) {
    const float inv = den > 0.f ? 1.f / den : 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= inv;
    lse = den > 0.f ? m + log2f(den) : kNegInf;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) rows[l * 8 + e] = acc[e];
  if (l == 0) lse_s[0] = lse;
  __syncthreads();
  const int qo_pos = P.kv.length(b) - 1;
  finish_rows<V, T, D>(rows, rows + D, lse_s, 1, b, qo_pos, h, P.num_qo_heads, static_cast<T*>(P.o), P.lse, hp,
                       threadIdx.x, blockDim.x, P.empty_lse());
}

}  // namespace attngen
