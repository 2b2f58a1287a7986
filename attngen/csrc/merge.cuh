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

// One merged row: request b, query head h, from `count` partial states (plan mode: rows slots[c] of part_o /
// part_lse; grid mode, slots = nullptr: chunk c of request b), by NTH threads in NTH / (D / 8) chunk groups
// (chunk c to group c % groups, then the groups in order), through `sm` (shared, at least
// (NTH / (D / 8) + 2) * D + 2 * NTH / (D / 8) + 1 floats); the output transform runs on the merged row. Every
// thread of the block calls it. Partials are read around L1 (__ldcg): in the fused merge they were written
// by other CTAs of the same kernel. kBatch chunks of a group are loaded before any is merged (the merge
// kernel takes 8: it runs alone after the decode; the fused merge 4, beside the decode's other CTAs).
template <class V, class T, int D, int NTH, int kBatch = 4>
__device__ __forceinline__ void merge_partial_rows(const DecodeProblem& P, const typename V::Params& hp, int b, int h,
                                                   const int32_t* slots, int count, float* sm, int tid) {
  constexpr int L = D / 8, NG = NTH / L;
  static_assert(NTH % L == 0 && NG >= 1, "whole chunk groups");
  float* g_acc = sm;             // [NG][D]
  float* rows = g_acc + NG * D;  // [2][D]
  float* g_m = rows + 2 * D;     // [NG]
  float* g_den = g_m + NG;       // [NG]
  float* lse_s = g_den + NG;     // [1]
  const int l = tid % L, grp = tid / L;
  // this group's chunks, in KV order within the group (the merge is exact in any order up to rounding)
  float m = kNegInf, den = 0.f, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (grp < NG) {
    // kBatch of the group's chunks are loaded before any is merged: one round of memory latency per
    // batch, not per chunk; the merge order (c = grp, grp + NG, ...) is unchanged
    for (int c0 = grp; c0 < count; c0 += kBatch * NG) {
      float lc[kBatch];
      float4 x[kBatch], y[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int c = c0 + u * NG;
        if (c < count) {
          const int64_t r = (slots ? int64_t(__ldcg(slots + c)) : int64_t(b) * P.num_chunks + c) * P.num_qo_heads + h;
          lc[u] = __ldcg(P.part_lse + r);
          const float4* src = reinterpret_cast<const float4*>(P.part_o + r * D + l * 8);
          x[u] = __ldcg(src);
          y[u] = __ldcg(src + 1);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (c0 + u * NG >= count) break;
        const float oc[8] = {x[u].x, x[u].y, x[u].z, x[u].w, y[u].x, y[u].y, y[u].z, y[u].w};
        // a partial row is normalised: its own denominator is 1 at scale 2^lc
        fold_state8<V::kSoftmax>(m, den, acc, lc[u], 1.f, [&](int e) { return oc[e]; });
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) g_acc[grp * D + l * 8 + e] = acc[e];
    if (l == 0) {
      g_m[grp] = m;
      g_den[grp] = den;
    }
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
        for (int e = 0; e < 8; ++e) acc[e] = acc[e] * ms.a + g_acc[g2 * D + l * 8 + e] * ms.b;
        m = ms.m;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += g_acc[g2 * D + l * 8 + e];
      }
    }
    const float lse = normalise_state8<V::kSoftmax>(m, den, acc);
#pragma unroll
    for (int e = 0; e < 8; ++e) rows[l * 8 + e] = acc[e];
    if (l == 0) lse_s[0] = lse;
  }
  __syncthreads();
  const int qo_pos = view_length<V>(P.kv, b) - 1;
  finish_rows<V, T, D>(rows, rows + D, lse_s, 1, b, qo_pos, h, P.num_qo_heads, static_cast<T*>(P.o), P.lse, hp,
                       tid, NTH, P.empty_lse());
}

// Row groups merge_partial_heads uses: D / 8 lanes each, at most 8 (one per head of the largest group).
template <int D, int NTH>
constexpr int merge_heads_groups() {
  return NTH / (D / 8) < 8 ? NTH / (D / 8) : 8;
}

// Floats of `sm` merge_partial_heads needs: an accumulator row and its state per row group, then the merged rows
// of up to 8 heads, their output-transform scratch rows and log-sum-exps.
template <int D, int NTH>
constexpr int merge_partial_heads_floats() {
  return merge_heads_groups<D, NTH>() * (D + 2) + 2 * 8 * D + 8;
}

// The merged rows of `heads` query heads h0 .. h0 + heads - 1 (at most 8) of request b from the same `count`
// partial states each (the fused merge: a KV head's group), all heads' loads in flight at once: the block's row
// groups (merge_heads_groups) split over the heads of a round (every head when they are no more than the groups),
// each group taking chunks part, part + sub, ... of its head (sub: the groups per head), kBatch loaded before any
// is merged; then one thread row per head merges its groups in order and the output transform runs on all rows.
// Every thread of the block calls it.
template <class V, class T, int D, int NTH, int kBatch = 4>
__device__ __forceinline__ void merge_partial_heads(const DecodeProblem& P, const typename V::Params& hp, int b,
                                                    int h0, int heads, const int32_t* slots, int count, float* sm,
                                                    int tid) {
  constexpr int L = D / 8, NG = merge_heads_groups<D, NTH>();
  static_assert(NTH % L == 0 && NG >= 1, "whole row groups");
  float* g_acc = sm;                 // [NG][D]
  float* g_m = g_acc + NG * D;       // [NG]
  float* g_den = g_m + NG;           // [NG]
  float* rows = g_den + NG;          // [8][D] merged rows, then [8][D] output-transform scratch
  float* lse_s = rows + 2 * 8 * D;   // [8]
  const int l = tid % L, grp = tid / L;
  for (int hb = 0; hb < heads; hb += NG) {
    const int hh = min(NG, heads - hb), sub = NG / hh;  // heads of this round, row groups per head
    const int hi = grp % hh, part = grp / hh;
    if (grp < hh * sub) {
      float m = kNegInf, den = 0.f, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const int h = h0 + hb + hi;
      for (int c0 = part; c0 < count; c0 += kBatch * sub) {
        float lc[kBatch];
        float4 x[kBatch], y[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int c = c0 + u * sub;
          if (c < count) {
            const int64_t slot = slots ? int64_t(__ldcg(slots + c)) : int64_t(b) * P.num_chunks + c;
            const int64_t r = slot * P.num_qo_heads + h;
            lc[u] = __ldcg(P.part_lse + r);
            const float4* src = reinterpret_cast<const float4*>(P.part_o + r * D + l * 8);
            x[u] = __ldcg(src);
            y[u] = __ldcg(src + 1);
          }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (c0 + u * sub >= count) break;
          const float oc[8] = {x[u].x, x[u].y, x[u].z, x[u].w, y[u].x, y[u].y, y[u].z, y[u].w};
          fold_state8<V::kSoftmax>(m, den, acc, lc[u], 1.f, [&](int e) { return oc[e]; });
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) g_acc[grp * D + l * 8 + e] = acc[e];
      if (l == 0) {
        g_m[grp] = m;
        g_den[grp] = den;
      }
    }
    __syncthreads();
    if (grp < hh) {  // head hb + grp: its row groups grp, grp + hh, ... in order
      float m = kNegInf, den = 0.f, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int p = 0; p < sub; ++p) {
        const int g2 = grp + p * hh;
        if constexpr (V::kSoftmax) {
          MergeScales ms = merge_scales(m, g_m[g2]);
          den = den * ms.a + g_den[g2] * ms.b;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e] = acc[e] * ms.a + g_acc[g2 * D + l * 8 + e] * ms.b;
          m = ms.m;
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e] += g_acc[g2 * D + l * 8 + e];
        }
      }
      const float lse = normalise_state8<V::kSoftmax>(m, den, acc);
#pragma unroll
      for (int e = 0; e < 8; ++e) rows[(hb + grp) * D + l * 8 + e] = acc[e];
      if (l == 0) lse_s[hb + grp] = lse;
    }
    __syncthreads();  // g_acc serves the next round; rows are complete for the output transform
  }
  const int qo_pos = view_length<V>(P.kv, b) - 1;
  finish_rows<V, T, D>(rows, rows + 8 * D, lse_s, heads, b, qo_pos, h0, P.num_qo_heads, static_cast<T*>(P.o), P.lse,
                       hp, tid, NTH, P.empty_lse());
}

template <int D, int NTH>
constexpr int merge_partial_rows_floats() {
  return (NTH / (D / 8) + 2) * D + 2 * (NTH / (D / 8)) + 1;
}

// grid (num_qo_heads, B), block kMergeGroups x D/8 threads; part_o [B, C, Hq, D], part_lse [B, C, Hq]; in plan
// mode grid (num_qo_heads, max merges) and part_o [slots, Hq, D], part_lse [slots, Hq]
template <class V, class T, int D>
__global__ void __launch_bounds__(kMergeGroups * D / 8) merge_decode_kernel(DecodeProblem P, typename V::Params hp) {
  constexpr int NTH = kMergeGroups * D / 8;
  __shared__ float sm[merge_partial_rows_floats<D, NTH>()];
  grid_dependency_wait();  // launched as the decode kernel's dependent: its partial states must be written
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
  merge_partial_rows<V, T, D, NTH, 8>(P, hp, b, blockIdx.x, slots, count, sm, threadIdx.x);
}

}  // namespace attngen
