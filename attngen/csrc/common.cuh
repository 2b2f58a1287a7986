// Shared device helpers for attngen's CUDA templates: 16-byte vector loads and
// conversions, base-2 math, warp reductions, and the attention-state merge rule.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <cmath>

#include "float_ops.h"

namespace attngen {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -INFINITY;
// The prefill templates' running row max moves only when a tile's max exceeds it by more than this (log2 units,
// step_row_max):
// a row's weights 2^(s - m) then stay below 2^kRescaleSlack (exact in fp32, in bf16 / fp16 P as relatively fine
// as below 1), and O and the row sum are rescaled only on such a rise, which after a row's first tiles is rare.
// The state (m, d, O) stays exact: m is whatever offset the weights were taken against.
constexpr float kRescaleSlack = 8.f;
constexpr float kTvmEmptyLse = -5e4f;  // TVM PagedKVCache's lse of a row with no visible key

// Programmatic dependent launch (sm_90+; no-ops before): a kernel launched with the programmatic
// stream-serialization attribute may start while the kernel before it finishes, and waits in
// grid_dependency_wait() until that kernel's writes are visible; the kernel before it lets it launch
// early with allow_dependent_launch().
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// counter += 1 at GPU scope, returning the old count: a release of what this thread (and, through a barrier
// before it, its warp or CTA) wrote, and an acquire of what the counts before it released; one atomic in place of
// a full fence on each side of a relaxed one (the split merges' "last finisher" counts)
__device__ __forceinline__ int count_acq_rel(int* counter) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

// *counter = v at GPU scope with release: what this thread wrote and acquired before it is visible to whoever
// acquires v (the tail's spread merge: the last piece's count, passed on to the pieces that wait on it)
__device__ __forceinline__ void store_release(int* counter, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(counter), "r"(v) : "memory");
}

// *counter at GPU scope with acquire: what the counts it sees released is visible after it
__device__ __forceinline__ int load_acquire(const int* counter) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
  return v;
}

// 8 elements of 16-bit type T (16 bytes) <-> float[8]
template <class T>
__device__ __forceinline__ void convert8(const uint4& raw, float (&out)[8]) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f;
    if constexpr (std::is_same_v<T, half>) {
      f = __half22float2(*reinterpret_cast<const half2*>(&w[i]));
    } else {
      f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    }
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

template <class T>
__device__ __forceinline__ void load8(const T* ptr, float (&out)[8]) {  // global, read-only path
  convert8<T>(__ldg(reinterpret_cast<const uint4*>(ptr)), out);
}

template <class T>
__device__ __forceinline__ void load8_shared(const T* ptr, float (&out)[8]) {
  convert8<T>(*reinterpret_cast<const uint4*>(ptr), out);
}

template <class T>
__device__ __forceinline__ void store8(T* ptr, const float (&in)[8]) {
  uint4 raw;
  uint32_t* w = reinterpret_cast<uint32_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, half>) {
      half2 h = __floats2half2_rn(in[2 * i], in[2 * i + 1]);
      w[i] = *reinterpret_cast<uint32_t*>(&h);
    } else {
      __nv_bfloat162 h = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
      w[i] = *reinterpret_cast<uint32_t*>(&h);
    }
  }
  *reinterpret_cast<uint4*>(ptr) = raw;
}

// 2^x on the special-function unit (ex2.approx.ftz: ~2 ulp, results below 2^-126 flush to 0, 2^-inf = 0):
// the softmax weights of the tile templates, where exp2f's extra range handling would sit on the
// critical path of every score.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// One key tile's step of a prefill template's running row maxima (rows g and g + 8 of an accumulator fragment):
// tile_max, this thread's maxima of the tile's logits (the running max taken in), reduced over the row's quad;
// the running max m_row moves only on a rise past kRescaleSlack (a finite max always rises past -inf). rescale:
// the factor O and the row sum take (1 where the max stayed); msub: the exponent's offset, so that a weight is
// 2^(s * fac - msub) with koff (the affine path's per-row offset, else 0) folded in, and a row whose max is -inf
// (only -inf logits) gets 2^(-inf - 0) = 0 without a per-score test. Returns whether a row of this thread moved.
__device__ __forceinline__ bool step_row_max(float (&tile_max)[2], float (&m_row)[2], const float (&koff)[2],
                                             float (&rescale)[2], float (&msub)[2]) {
  bool grew = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
    const bool rise = tile_max[h] > m_row[h] + kRescaleSlack;
    grew |= rise;
    rescale[h] = rise ? fast_exp2(m_row[h] - tile_max[h]) : 1.f;
    if (rise) m_row[h] = tile_max[h];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) msub[h] = (m_row[h] == kNegInf ? 0.f : m_row[h]) - koff[h];
  return grew;
}

// step_row_max, or where the rows hold their max (a fixed row max on an interior tile: score_rules.cuh
// fix_row_max) no reduction and no rise: rescale 1, the held max the exponent's offset.
__device__ __forceinline__ bool step_or_hold_row_max(bool hold, float (&tile_max)[2], float (&m_row)[2],
                                                     const float (&koff)[2], float (&rescale)[2], float (&msub)[2]) {
  if (!hold) return step_row_max(tile_max, m_row, koff, rescale, msub);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rescale[h] = 1.f;
    msub[h] = m_row[h];
  }
  return false;
}

// Sum over the `Width` lanes of a lane group (Width a power of two <= 32).
template <int Width>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int off = Width / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off, 32);
  return x;
}

// Halves the live width W of per-row partials v[n][h] until v[0][h] holds the reduction (compile-time
// levels: a loop over W here was left rolled, its array in local memory).
template <int W, class Op>
__device__ __forceinline__ void fold_rows(float (*v)[2], Op op) {
#pragma unroll
  for (int n = 0; n < W; ++n) {
    v[n][0] = op(v[n][0], v[n + W][0]);
    v[n][1] = op(v[n][1], v[n + W][1]);
  }
  if constexpr (W > 1) fold_rows<W / 2>(v, op);
}

// Per-thread reduction (max or sum, by `op`) over an m-tile's scores of its two rows (elements 0-1: row g,
// 2-3: row g + 8) as a pairwise tree: log2 dependent steps instead of a chain through every score. (The
// same tree as tile_row_reduce below, which the Hopper template uses: the mma.sync template keeps this loop
// form because its measured instruction schedule was built with it; at 16 blocks the loop is left rolled.)
template <int N, class Op>
__device__ __forceinline__ void row_tree(const float (&s)[N][4], float (&out)[2], Op op) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "n-tiles per row: a power of two");
  float v[N][2];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    v[n][0] = op(s[n][0], s[n][1]);
    v[n][1] = op(s[n][2], s[n][3]);
  }
#pragma unroll
  for (int w = N / 2; w >= 1; w /= 2)
#pragma unroll
    for (int n = 0; n < w; ++n) {
      v[n][0] = op(v[n][0], v[n + w][0]);
      v[n][1] = op(v[n][1], v[n + w][1]);
    }
  out[0] = v[0][0];
  out[1] = v[0][1];
}

// The largest power of two not above n (n >= 1).
constexpr int pow2_floor(int n) { return n < 2 ? 1 : 2 * pow2_floor(n / 2); }

// Per-thread reduction (max or sum, by `op`) of a tile's scores over this thread's two rows (mma.sync /
// wgmma accumulator fragments: elements 0-1 of an 8-column block are row g, 2-3 row g + 8), as a pairwise
// tree: log2 dependent steps instead of a chain through every score. N blocks past a power of two (22 of a
// 176-key tile, 24 of a 192-key one) fold into the first ones before the tree.
template <int N, class Op>
__device__ __forceinline__ void tile_row_reduce(const float (&s)[N][4], float (&out)[2], Op op) {
  static_assert(N > 1, "8-column blocks per tile: at least two");
  constexpr int P = pow2_floor(N);
  float v[N][2];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    v[n][0] = op(s[n][0], s[n][1]);
    v[n][1] = op(s[n][2], s[n][3]);
  }
#pragma unroll
  for (int n = P; n < N; ++n) {
    v[n - P][0] = op(v[n - P][0], v[n][0]);
    v[n - P][1] = op(v[n - P][1], v[n][1]);
  }
  fold_rows<P / 2>(v, op);
  out[0] = v[0][0];
  out[1] = v[0][1];
}

// An online-softmax state for one row: running max m (base 2), denominator d.
// Non-finite states (see attngen/runtime/reference.py): an empty side (m = -inf, d = 0) contributes
// nothing and two empty sides stay empty, never NaN; a poisoned side (m or d NaN) makes the merge NaN,
// which the max must not drop (fmax_nan), even against an empty side.
struct MergeScales {
  float m, a, b;  // new max, scale of side a, scale of side b
};

__device__ __forceinline__ MergeScales merge_scales(float ma, float mb) {
  float m = fmax_nan(ma, mb);
  if (m == kNegInf) return {kNegInf, 0.f, 0.f};
  return {m, exp2f(ma - m), exp2f(mb - m)};
}

// Folds an 8-element slice of state (m2, d2, o2(e)) into the running slice (m, d, acc): softmax states by
// their base-2 max and denominator, sum states (kSoftmax false) by addition, m and d unused.
template <bool kSoftmax, class Get>
__device__ __forceinline__ void fold_state8(float& m, float& d, float (&acc)[8], float m2, float d2, Get o2) {
  if constexpr (kSoftmax) {
    const MergeScales ms = merge_scales(m, m2);
    d = d * ms.a + d2 * ms.b;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = acc[e] * ms.a + o2(e) * ms.b;
    m = ms.m;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += o2(e);
  }
}

// Normalises a folded softmax slice by its denominator and returns its base-2 lse (-inf for an empty
// state, d = 0; a NaN d, a poisoned row, gives NaN O and lse); a sum state (kSoftmax false) stays as it
// is, lse 0.
template <bool kSoftmax>
__device__ __forceinline__ float normalise_state8(float m, float d, float (&acc)[8]) {
  float lse = 0.f;
  if constexpr (kSoftmax) {
    const float inv = d == 0.f ? 0.f : 1.f / d;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= inv;
    lse = d == 0.f ? kNegInf : m + log2f(d);
  }
  return lse;
}

}  // namespace attngen
