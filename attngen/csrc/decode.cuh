// Batch decode over a paged KV cache on CUDA cores.
//
// One CTA = (KV chunk, KV head, request). All query heads of the KV head's group
// live in the CTA, so each K/V row is read once for the whole group. A row of D
// elements is spread over L = D/8 lanes (16-byte vector loads); a warp holds
// 32/L lane groups, each working through U tokens per step so several loads are
// in flight. Online softmax in fp32, base 2. The mask's bounds (causal, sliding
// window) shrink the visited KV range before any page is touched. With more than
// one chunk the CTA writes a partial state (o, lse) for merge.cuh.
#pragma once
#include "common.cuh"
#include "epilogue.cuh"

namespace attngen {

struct PagedKV {
  const void* pages;
  const int32_t* indptr;         // [B+1] into indices
  const int32_t* indices;        // [nnz] page ids
  const int32_t* last_page_len;  // [B]
  int64_t stride_page, stride_kv, stride_slot, stride_head;  // elements
  int page_size;

  __device__ __forceinline__ int length(int b) const {
    int n = indptr[b + 1] - indptr[b];
    return n > 0 ? (n - 1) * page_size + last_page_len[b] : 0;
  }
};

struct DecodeProblem {
  const void* q;    // [B, Hq, D]
  void* o;          // [B, Hq, D]
  float* lse;       // [B, Hq], base 2
  float* part_o;    // [B, C, Hq, D] partial outputs when num_chunks > 1
  float* part_lse;  // [B, C, Hq]
  int batch, num_qo_heads, num_kv_heads, group, num_chunks;
  float sm_scale;
  PagedKV kv;
};

template <int D>
struct DecodeTile {
  static_assert(D == 64 || D == 128 || D == 256, "decode supports head_dim 64, 128, 256");
  static constexpr int kVec = 8;
  static constexpr int kLanes = D / kVec;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kGroupsPerWarp = 32 / kLanes;
  static constexpr int kTokenGroups = kWarps * kGroupsPerWarp;
  static constexpr int kUnroll = D <= 128 ? 4 : 2;  // tokens per lane group per step
};

template <class V, int D, int G>
constexpr size_t decode_smem_floats() {
  using Tile = DecodeTile<D>;
  size_t rows = 2 * size_t(G) * D;                                          // q staging (in + out)
  size_t merge = size_t(Tile::kWarps) * G * (D + 2) + 2 * size_t(G) * D + G;  // state merge + output rows
  size_t keys = V::kHasKeyTransform ? 2 * size_t(Tile::kTokenGroups) * Tile::kUnroll * D : 0;
  size_t m = rows > merge ? rows : merge;
  return m > keys ? m : keys;
}

template <class V, class T, int D, int G>
__global__ void __launch_bounds__(DecodeTile<D>::kThreads)
decode_kernel(DecodeProblem P, typename V::Params hp) {
  using Tile = DecodeTile<D>;
  constexpr int L = Tile::kLanes, U = Tile::kUnroll, GPW = Tile::kGroupsPerWarp;
  extern __shared__ float smem[];
  const int chunk = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % L, gi = (tid % 32) / L;
  const int group = P.group, qh0 = hk * group;

  const int kv_len = P.kv.length(b);
  const int qo_pos = kv_len - 1;
  int lo = 0, hi = kv_len;
  if constexpr (V::kHasUpper) lo = max(lo, qo_pos - V::mask_upper(hp));
  if constexpr (V::kHasLower) hi = min(hi, qo_pos - V::mask_lower(hp) + 1);
  const int span = max(hi - lo, 0);
  const int per = (span + P.num_chunks - 1) / P.num_chunks;
  const int start = lo + chunk * per, end = min(hi, start + per);

  // ---- query rows: load, transform, scale -------------------------------------------
  float q[G][8];
  const T* qbase = static_cast<const T*>(P.q) + (int64_t(b) * P.num_qo_heads + qh0) * D;
  if constexpr (V::kHasQueryTransform) {
    for (int idx = tid; idx < group * L; idx += blockDim.x) {
      float v[8];
      load8(qbase + (idx / L) * D + (idx % L) * 8, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) smem[(idx / L) * D + (idx % L) * 8 + e] = v[e];
    }
    __syncthreads();
    float* out = smem + G * D;
    for (int idx = tid; idx < group * L; idx += blockDim.x) {
      int r = idx / L, l = idx % L;
      if constexpr (V::kQueryElementwise) {
#pragma unroll
        for (int e = 0; e < 8; ++e) out[r * D + l * 8 + e] = V::query_elem(hp, smem + r * D, l * 8 + e, qo_pos, qh0 + r);
      } else if (l == 0) {
        V::query_row(hp, smem + r * D, out + r * D, qo_pos, qh0 + r);
      }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) q[g][e] = g < group ? out[g * D + lane * 8 + e] : 0.f;
    __syncthreads();
  } else {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (g < group) load8(qbase + g * D + lane * 8, q[g]);
    }
  }
  const float qscale = P.sm_scale * (V::kQScaleLog2e ? kLog2e : 1.f);
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) q[g][e] *= qscale;

  // ---- main loop over this chunk's keys ------------------------------------------------
  float m[G], den[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = kNegInf;
    den[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
  }
  const T* pages = static_cast<const T*>(P.kv.pages);
  const int32_t* page_ids = P.kv.indices + P.kv.indptr[b];
  const int64_t head_off = int64_t(hk) * P.kv.stride_head + lane * 8;
  float* krow = smem + (size_t(warp) * GPW + gi) * U * D * 2;  // this lane group's key rows (in, out)

  for (int base = start + warp * GPW * U; base < end; base += Tile::kWarps * GPW * U) {
    const int j0 = base + gi * U;
    float k[U][8], v[U][8];
    int64_t off[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int j = j0 + u;
      if (j < end) {
        int page = page_ids[j / P.kv.page_size];
        off[u] = int64_t(page) * P.kv.stride_page + int64_t(j % P.kv.page_size) * P.kv.stride_slot + head_off;
        load8(pages + off[u], k[u]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) k[u][e] = 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (j0 + u < end) {
        load8(pages + off[u] + P.kv.stride_kv, v[u]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[u][e] = 0.f;
      }
    }
    if constexpr (V::kHasKeyTransform) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int e = 0; e < 8; ++e) krow[u * D + lane * 8 + e] = k[u][e];
      __syncwarp();
#pragma unroll
      for (int u = 0; u < U; ++u) {
        int j = j0 + u;
        if (j < end) {
          if constexpr (V::kKeyElementwise) {
#pragma unroll
            for (int e = 0; e < 8; ++e) k[u][e] = V::key_elem(hp, krow + u * D, lane * 8 + e, j, hk);
          } else if (lane == 0) {
            V::key_row(hp, krow + u * D, krow + (U + u) * D, j, hk);
          }
        }
      }
      if constexpr (!V::kKeyElementwise) {
        __syncwarp();
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int e = 0; e < 8; ++e) k[u][e] = krow[(U + u) * D + lane * 8 + e];
      }
      __syncwarp();
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u;
      const bool valid = j < end;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (g >= group) continue;
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) s = fmaf(q[g][e], k[u][e], s);
        s = group_sum<L>(s);
        if (!valid) continue;
        const int qh = qh0 + g;
        if constexpr (V::kHasLogits) {
          s = V::logits(hp, s, b, qo_pos, j, qh, hk);
          if constexpr (V::kLogitsLog2e) s *= kLog2e;
        }
        if constexpr (V::kHasMask) {
          if (!V::mask(hp, b, qo_pos, j, qh, hk)) continue;
        }
        if constexpr (V::kSoftmax) {
          float mn = fmaxf(m[g], s);
          if (mn == kNegInf) continue;
          float sc = exp2f(m[g] - mn), w = exp2f(s - mn);
          den[g] = den[g] * sc + w;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(w, v[u][e], acc[g][e] * sc);
          m[g] = mn;
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(s, v[u][e], acc[g][e]);
        }
      }
    }
  }

  // ---- merge the lane groups of a warp, then the warps ---------------------------------
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int off = L; off < 32; off <<= 1) {
      float mo = __shfl_xor_sync(0xffffffffu, m[g], off);
      float dn = __shfl_xor_sync(0xffffffffu, den[g], off);
      MergeScales ms = V::kSoftmax ? merge_scales(m[g], mo) : MergeScales{0.f, 1.f, 1.f};
      den[g] = den[g] * ms.a + dn * ms.b;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float ao = __shfl_xor_sync(0xffffffffu, acc[g][e], off);
        acc[g][e] = acc[g][e] * ms.a + ao * ms.b;
      }
      m[g] = ms.m;
    }
  }
  __syncthreads();  // smem is free again (query / key staging done)
  float* wstate = smem;                                     // [warps][G][2]
  float* wacc = smem + Tile::kWarps * G * 2;                // [warps][G][D]
  if (tid % 32 < L) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (lane == 0) {
        wstate[(warp * G + g) * 2] = m[g];
        wstate[(warp * G + g) * 2 + 1] = den[g];
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) wacc[(warp * G + g) * D + lane * 8 + e] = acc[g][e];
    }
  }
  __syncthreads();
  float* rows = wacc + Tile::kWarps * G * D;  // [G][D] final rows (normalised), then [G][D] scratch
  float* row_lse = rows + 2 * G * D;          // [G]
  for (int idx = tid; idx < group * L; idx += blockDim.x) {
    const int g = idx / L, l = idx % L;
    float fm = kNegInf, fd = 0.f, fa[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int w = 0; w < Tile::kWarps; ++w) {
      float mw = wstate[(w * G + g) * 2], dw = wstate[(w * G + g) * 2 + 1];
      MergeScales ms = V::kSoftmax ? merge_scales(fm, mw) : MergeScales{0.f, 1.f, 1.f};
      fd = fd * ms.a + dw * ms.b;
#pragma unroll
      for (int e = 0; e < 8; ++e) fa[e] = fa[e] * ms.a + wacc[(w * G + g) * D + l * 8 + e] * ms.b;
      fm = ms.m;
    }
    float lse_v = 0.f;
    if constexpr (V::kSoftmax) {
      const float inv = fd > 0.f ? 1.f / fd : 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) fa[e] *= inv;
      lse_v = fd > 0.f ? fm + log2f(fd) : kNegInf;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) rows[g * D + l * 8 + e] = fa[e];
    if (l == 0) row_lse[g] = lse_v;
  }
  __syncthreads();

  if (P.num_chunks > 1) {  // partial state for merge.cuh; the output transform runs after the merge
    for (int idx = tid; idx < group * L; idx += blockDim.x) {
      const int g = idx / L, l = idx % L;
      const int64_t r = (int64_t(b) * P.num_chunks + chunk) * P.num_qo_heads + qh0 + g;
      float4* dst = reinterpret_cast<float4*>(P.part_o + r * D + l * 8);
      dst[0] = make_float4(rows[g * D + l * 8], rows[g * D + l * 8 + 1], rows[g * D + l * 8 + 2], rows[g * D + l * 8 + 3]);
      dst[1] = make_float4(rows[g * D + l * 8 + 4], rows[g * D + l * 8 + 5], rows[g * D + l * 8 + 6], rows[g * D + l * 8 + 7]);
      if (l == 0) P.part_lse[r] = row_lse[g];
    }
    return;
  }
  finish_rows<V, T, D>(rows, rows + G * D, row_lse, group, b, qo_pos, qh0, P.num_qo_heads,
                       static_cast<T*>(P.o), P.lse, hp);
}

}  // namespace attngen
