// The row-hook pass: a variant's key and query transforms applied once per row ahead of a prefill, into a
// workspace the prefill then reads as its keys and queries (PrefillProblem::hooks_applied tells both templates
// to skip the hooks they would otherwise apply per tile).
//
// Inside the templates the key transform runs on every K/V tile an item reads, so a request of n query tiles
// transforms each of its keys n times (the producer warpgroup of the Hopper template alone, a latency-bound
// loop): RoPE in the query / key hooks ran a full L 8k prefill at 22 TFLOP/s on the H200 against 633 plain
// (benchmarks/results/variants_2026-12-03_rope.md); with the pass, 563 (variants_2026-12-03_hook_pass.md). The
// pass transforms each (key, KV head) row once, one warp per position and chunk of heads (hook_pass_heads), over
// the whole GPU, and rounds its rows to the cache's element type as the templates round their transformed tiles. The results agree with the per-tile
// hooks' to rounding, not bit for bit: the compiler may contract the hook's float math into FMAs differently
// in the two kernels, so a few transformed elements differ in their last bit.
//
// Workspace (hook_pass_layout): [keys][queries][page ids], each part 256-byte aligned:
// - keys, where the variant has a key transform: a ragged view's K rows at their own offsets (the values
//   stay where they are); a paged view's pages, K and V, page i of the workspace holding the page of entry
//   i of the page table, packed (hook_pass_packed_pages: whatever the pool's strides, e.g. vLLM's [2, P, ...]
//   cache transposed, whose K and V of a page lie far apart) and read by the prefill through an identity page
//   table;
// - queries [q_rows, Hq, D], where it has a query transform;
// - page ids (paged views): the identity page table, written by the pass.
// The kernel reads the cache's 16-bit element type from a flag, not a template argument, so that linked
// builds compile one instance per head dim (the classifier's part, codegen/lto.py).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <algorithm>
#include <string>

#include "common.cuh"
#include "cubin_launch.h"
#include "device_info.cuh"
#include "hook_abi.h"
#include "kv_rows.cuh"
#include "row_hook.cuh"

namespace attngen {

struct HookPassProblem {
  KVRows kv;                 // the call's view
  unsigned char* k_out;      // keys (ragged: in the view's strides) and a paged view's values, or null
  KVRows out;                // paged: the workspace's pages as a view (hook_pass_packed_pages; base k_out)
  int32_t* page_ids;         // paged: the identity page table [kv_units]
  const void* q;             // [q_rows, Hq, D], token rows q_stride elements apart
  void* q_out;               // [q_rows, Hq, D] packed, or null
  int64_t q_stride;          // elements between q's token rows
  const int32_t* qo_indptr;  // [B+1]
  int64_t kv_units;          // ragged: rows of k; paged: entries of the page table
  int64_t q_rows;
  int batch, num_kv_heads, num_qo_heads, bf16;

  // the pass's tasks (a warp each): (unit, slot, chunk of `hc` KV heads) of the keys where k_out is set, then
  // (query row, chunk of `hc` heads) of the queries where q_out is
  __host__ __device__ int rows_per_unit() const { return kv.page_size > 0 ? kv.page_size : 1; }
  __host__ __device__ static int chunks(int heads, int hc) { return (heads + hc - 1) / hc; }
  __host__ __device__ int64_t key_tasks(int per_unit, int hc) const {
    return k_out ? kv_units * per_unit * chunks(num_kv_heads, hc) : 0;
  }
  __host__ __device__ int64_t query_tasks(int hc) const { return q_out ? q_rows * chunks(num_qo_heads, hc) : 0; }
};

// Byte offsets of the workspace's parts and its size (the Python side mirrors it: runtime/hook_pass.py).
struct HookPassLayout {
  int64_t keys, queries, page_ids, bytes;
};

inline int64_t hook_pass_align(int64_t n) { return (n + 255) / 256 * 256; }

// The workspace's copy of a paged view `kv` of `heads` KV heads: `units` pages [2][page_size][heads][D] (keys,
// then values; a token's heads packed), base `base`, the identity page table `page_ids`; its page count `units`.
template <int D>
inline KVRows hook_pass_packed_pages(const KVRows& kv, int heads, void* base, const int32_t* page_ids) {
  KVRows out = kv;
  out.base = base;
  out.indices = page_ids;
  out.stride_head = D;
  out.stride_slot = int64_t(heads) * D;
  out.stride_kv = int64_t(kv.page_size) * heads * D;
  out.stride_page = 2 * out.stride_kv;
  return out;
}

// key_bytes: the keys part (0 without a key transform); query_bytes likewise; units: paged entries (0: ragged).
inline HookPassLayout hook_pass_layout(int64_t key_bytes, int64_t query_bytes, int64_t units) {
  HookPassLayout l{};
  l.keys = 0;
  l.queries = hook_pass_align(key_bytes);
  l.page_ids = l.queries + hook_pass_align(query_bytes);
  l.bytes = l.page_ids + units * int64_t(sizeof(int32_t));
  return l;
}

__device__ __forceinline__ float hook_pass_load(const void* p, int64_t i, bool bf16) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : __half2float(static_cast<const __half*>(p)[i]);
}

__device__ __forceinline__ void hook_pass_store(void* p, int64_t i, float x, bool bf16) {
  if (bf16) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
  } else {
    static_cast<__half*>(p)[i] = __float2half_rn(x);
  }
}

// The request holding entry `u` of indptr [B+1] (the last b with indptr[b] <= u), or -1 outside them all.
__device__ __forceinline__ int hook_pass_request(const int32_t* indptr, int batch, int64_t u) {
  if (batch <= 0 || u < indptr[0] || u >= indptr[batch]) return -1;
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (indptr[mid] <= u) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Heads one warp transforms at one position: an element-wise hook's terms that depend on the position and the
// element but not on the head (RoPE's angle, its power, sine and cosine) are computed once for them all (the
// hook is inlined into an unrolled loop over the heads, whose common subexpressions the compiler shares), not
// once per head.
template <int D>
constexpr int hook_pass_heads() {
  return D <= 128 ? 8 : 4;
}

// Up to HC (n) rows of one position through a row hook with one warp: element i of row h from src at
// src_off + h * head_stride + i, the result to dst likewise in the cache's 16-bit type; elem(row, i, h) is the
// element-wise form, whole(in, out, h) the whole-row form. rows: HC x D floats of this warp.
template <int D, int HC, bool Elementwise, class Elem, class Whole>
__device__ __forceinline__ void hook_pass_rows(float (*rows)[D], int n, const void* src, int64_t src_off, void* dst,
                                               int64_t dst_off, int64_t head_stride, int64_t dst_head_stride,
                                               bool bf16, Elem elem, Whole whole, int lane) {
  if constexpr (Elementwise) {
#pragma unroll
    for (int h = 0; h < HC; ++h)
      if (h < n)
        for (int i = lane; i < D; i += 32) rows[h][i] = hook_pass_load(src, src_off + h * head_stride + i, bf16);
    __syncwarp();
    for (int i = lane; i < D; i += 32) {
#pragma unroll
      for (int h = 0; h < HC; ++h)
        if (h == 0 || h < n) hook_pass_store(dst, dst_off + h * dst_head_stride + i, elem(rows[h], i, h), bf16);
    }
  } else {
    for (int h = 0; h < n; ++h) {
      for (int i = lane; i < D; i += 32) rows[0][i] = hook_pass_load(src, src_off + h * head_stride + i, bf16);
      __syncwarp();
      warp_row_hook<D, false>(rows[0], rows[1], [](float*, int) { return 0.f; },
                              [&](float* in, float* out) { whole(in, out, h); }, lane);
      for (int i = lane; i < D; i += 32) hook_pass_store(dst, dst_off + h * dst_head_stride + i, rows[1][i], bf16);
      __syncwarp();
    }
  }
}

// One warp per position and chunk of heads: (unit, slot) of the keys, then query rows. D (the traits' head dim)
// names the kernel in a linked cubin's table: hook_pass_kernel<128>.
template <class V, int D = V::kHeadDim>
__global__ void __launch_bounds__(256) hook_pass_kernel(HookPassProblem H, typename V::Params hp) {
  constexpr int HC = hook_pass_heads<D>();
  static_assert(HC >= 2, "the whole-row form takes two rows of scratch");
  __shared__ float rows[8][HC][D];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool bf16 = H.bf16 != 0;
  const KVRows& kv = H.kv;
  const bool paged = kv.page_size > 0;
  const int per_unit = paged ? kv.page_size : 1;
  const int k_chunks = HookPassProblem::chunks(H.num_kv_heads, HC), q_chunks = HookPassProblem::chunks(H.num_qo_heads, HC);
  const int64_t key_tasks = H.key_tasks(per_unit, HC), q_tasks = H.query_tasks(HC);
  const int64_t stride = int64_t(gridDim.x) * 8;
  if (paged && H.page_ids) {
    for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < H.kv_units; u += stride * 32)
      H.page_ids[u] = int32_t(u);
  }
  const int shift = kv.page_shift();
  for (int64_t t = int64_t(blockIdx.x) * 8 + warp; t < key_tasks + q_tasks; t += stride) {
    if (t < key_tasks) {
      if constexpr (V::kHasKeyTransform) {
        const int64_t u = t / (int64_t(per_unit) * k_chunks);
        const int slot = int(t / k_chunks % per_unit), hk0 = int(t % k_chunks) * HC;
        const int n = min(HC, H.num_kv_heads - hk0);
        const int b = hook_pass_request(kv.indptr, H.batch, u);
        if (b < 0) continue;
        const int start = kv.indptr[b];
        const int j = int(u - start) * per_unit + slot;  // the key's index in its request
        if (j >= kv.length(b)) continue;
        const int64_t sh = kv.stride_head;
        const int64_t src = kv.key_offset(start, j, shift) + int64_t(hk0) * sh;
        // ragged: the workspace keeps the view's strides; paged: its packed page u holds entry u's page
        const KVRows& o = H.out;
        const int64_t dh = paged ? o.stride_head : sh;
        const int64_t dst = paged ? u * o.stride_page + int64_t(slot) * o.stride_slot + int64_t(hk0) * dh : src;
        hook_pass_rows<D, HC, V::kKeyElementwise>(
            rows[warp], n, kv.base, src, H.k_out, dst, sh, dh, bf16,
            [&](float* row, int i, int h) { return V::key_elem(hp, row, i, j, hk0 + h); },
            [&](float* in, float* out, int h) { V::key_row(hp, in, out, j, hk0 + h); }, lane);
        if (paged) {  // the value rows move with their page
          const uint16_t* vs = static_cast<const uint16_t*>(kv.base) + src + kv.stride_kv;
          uint16_t* vd = reinterpret_cast<uint16_t*>(H.k_out) + dst + o.stride_kv;
          for (int h = 0; h < n; ++h)
            for (int i = lane; i < D; i += 32) vd[h * dh + i] = vs[h * sh + i];
        }
        __syncwarp();
      }
    } else {
      if constexpr (V::kHasQueryTransform) {
        const int64_t r = t - key_tasks, tok = r / q_chunks;
        const int qh0 = int(r % q_chunks) * HC, n = min(HC, H.num_qo_heads - qh0);
        const int b = hook_pass_request(H.qo_indptr, H.batch, tok);
        if (b < 0) continue;
        const int q0 = H.qo_indptr[b], qo_len = H.qo_indptr[b + 1] - q0;
        const int qo_pos = kv.length(b) - qo_len + int(tok - q0);
        const int64_t in = tok * H.q_stride + int64_t(qh0) * D, off = (tok * H.num_qo_heads + qh0) * D;
        hook_pass_rows<D, HC, V::kQueryElementwise>(
            rows[warp], n, H.q, in, H.q_out, off, D, D, bf16,
            [&](float* row, int i, int h) { return V::query_elem(hp, row, i, qo_pos, qh0 + h); },
            [&](float* in, float* out, int h) { V::query_row(hp, in, out, qo_pos, qh0 + h); }, lane);
        __syncwarp();
      }
    }
  }
}

template <class V>
void launch_hook_pass_kernel(const HookPassProblem& H, const typename V::Params& hp, cudaStream_t stream) {
  using Fn = void (*)(HookPassProblem, typename V::Params);
  Fn kernel;
  if constexpr (linked_hooks<V>()) {
    kernel = linked_kernel_cached<Fn>([] { return "hook_pass_kernel<" + std::to_string(V::kHeadDim) + ">"; });
  } else {
    kernel = hook_pass_kernel<V>;
  }
  constexpr int HC = hook_pass_heads<V::kHeadDim>();
  const int64_t tasks = H.key_tasks(H.rows_per_unit(), HC) + H.query_tasks(HC);
  if (tasks == 0 && !H.page_ids) return;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((tasks + 7) / 8, int64_t(device_sm_count()) * 16));
  launch_kernel(kernel, dim3(unsigned(blocks)), dim3(256), 0, stream, H, hp);
}

// The pass's kernel: the traits' own instance, or in linked builds the one of the cubin (cubin_launch.h).
// Traits without a key or query transform have none (nothing calls it: entry_prefill.h apply_hook_pass).
template <class V>
void launch_hook_pass(const HookPassProblem& H, const typename V::Params& hp, cudaStream_t stream) {
  if constexpr (V::kHasKeyTransform || V::kHasQueryTransform) launch_hook_pass_kernel<V>(H, hp, stream);
}

}  // namespace attngen
