// Merge the partial states of split-KV chunks: softmax states by their base-2 lse,
// sum states by addition; an empty chunk (lse = -inf) contributes nothing and two
// empty states stay empty (O = 0, lse = -inf), never NaN. The output transform runs
// here, once, on the merged row.
#pragma once
#include "common.cuh"
#include "decode.cuh"
#include "epilogue.cuh"

namespace attngen {

// Chunk groups of one merge: chunk c goes to group c % kMergeGroups, D / 8 lanes each, so a long split
// (a 64k-key request cut into 33 chunks) takes a few dependent load rounds instead of one per chunk.
constexpr int kMergeGroups = 8;

// grid (num_qo_heads, B), block kMergeGroups x D/8 threads; part_o [B, C, Hq, D], part_lse [B, C, Hq]; in plan
// mode grid (num_qo_heads, max merges) and part_o [slots, Hq, D], part_lse [slots, Hq]
template <class V, class T, int D>
__global__ void __launch_bounds__(kMergeGroups * D / 8) merge_decode_kernel(DecodeProblem P, typename V::Params hp) {
  constexpr int L = D / 8, NG = kMergeGroups;
  __shared__ float rows[2 * D];
  __shared__ float lse_s[1];
  __shared__ float g_acc[NG][D];
  __shared__ float g_m[NG], g_den[NG];
  grid_dependency_wait();  // launched as the decode kernel's dependent: its partial states must be written
  const int h = blockIdx.x, l = threadIdx.x % L, grp = threadIdx.x / L;
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
  // this group's chunks, in KV order within the group (the merge is exact in any order up to rounding)
  float m = kNegInf, den = 0.f, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int c = grp; c < count; c += NG) {
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
#pragma unroll
  for (int e = 0; e < 8; ++e) g_acc[grp][l * 8 + e] = acc[e];
  if (l == 0) {
    g_m[grp] = m;
    g_den[grp] = den;
  }
  __syncthreads();
  // group 0 merges the groups' states in group order; an empty group (m = -inf, den = 0) adds nothing
  if (grp == 0) {
    m = kNegInf;
    den = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.f;
    for (int g2 = 0; g2 < NG; ++g2) {
      if constexpr (V::kSoftmax) {
        MergeScales ms = merge_scales(m, g_m[g2]);
        den = den * ms.a + g_den[g2] * ms.b;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = acc[e] * ms.a + g_acc[g2][l * 8 + e] * ms.b;
        m = ms.m;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += g_acc[g2][l * 8 + e];
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
  }
  __syncthreads();
  const int qo_pos = P.kv.length(b) - 1;
  finish_rows<V, T, D>(rows, rows + D, lse_s, 1, b, qo_pos, h, P.num_qo_heads, static_cast<T*>(P.o), P.lse, hp,
                       threadIdx.x, blockDim.x, P.empty_lse());
}

}  // namespace attngen
