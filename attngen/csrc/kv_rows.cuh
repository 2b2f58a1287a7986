// The KV view every template reads: paged (a page table over a page pool, NHD or HND by
// strides) or ragged (rows of a contiguous K/V tensor), addressed per request and key; and
// TVM's sliding-window view of paged requests (sink rows, then the rows from a window offset on),
// which only the windowed instances of the templates read (tvm_window.cuh).
#pragma once
#include <stdint.h>

namespace attngen {

// Entry p of an index array (indptr, last_page_len, qo_indptr: read-only while a kernel runs), loaded where the
// code stands. A plain load is sunk behind the first test that needs it (nvcc put a paged request's
// last_page_len behind `n > 0`, and its indptr entries behind the test of its query rows: three round trips on
// the way to the request's first keys); a volatile load runs on every path through it, so that entries read
// together travel together.
__device__ __forceinline__ int load_index(const int32_t* p) {
  int v;
  asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// A request's keys in TVM's sliding-window view: key j lies at row j (j < sink) or j + shift.
struct SinkShift {
  int sink, shift;
  __device__ __forceinline__ int row(int j) const { return j < sink ? j : j + shift; }
};

// Where row j of request b's keys (kv = 0) or values (kv = 1) lives.
struct KVRows {
  const void* base;
  const int32_t* indptr;         // paged: into indices; ragged: into rows
  const int32_t* indices;        // paged: page ids; ragged: nullptr
  const int32_t* last_page_len;  // paged only
  int64_t stride_page, stride_kv, stride_slot, stride_head;  // ragged: stride_slot = row stride
  int page_size;                                             // 0: ragged
  int64_t rows;  // ragged: rows of the K / V tensors; paged: pages of the pool (bulk-copy descriptors' bounds)
  // paged, TVM's sliding-window view (length_info [3, B]): per request, the sink size and the row its
  // window starts at; nullptr elsewhere (read by the windowed instances only)
  const int32_t* sink;
  const int32_t* window_offset;
  // (paged: last_page_len[b] is read beside the indptr entries (load_index), not behind the test of the request's
  // page count, which would put a second round trip on the path to a request's first keys)
  __device__ __forceinline__ int length(int b) const {
    const int start = load_index(indptr + b), end = load_index(indptr + b + 1);
    if (page_size == 0) return end - start;
    const int n = end - start, last = load_index(last_page_len + b);
    return n > 0 ? (n - 1) * page_size + last : 0;
  }
  // Keys of request b in the sliding-window view: its rows minus the window offset, plus its sinks (TVM's
  // _get_kv_chunk_len).
  __device__ __forceinline__ int window_length(int b) const {
    const int n = load_index(indptr + b + 1) - load_index(indptr + b);
    const int rows = load_index(last_page_len + b) - load_index(window_offset + b) + load_index(sink + b);
    return n > 0 ? (n - 1) * page_size + rows : 0;
  }
  __device__ __forceinline__ SinkShift sinks(int b) const { return {sink[b], window_offset[b] - sink[b]}; }
  // log2(page_size) where it is a power of two, else -1: key_offset's page and slot without a division
  __device__ __forceinline__ int page_shift() const {
    return page_size > 0 && (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
  }
  // (page, slot in it) of key row j of a paged request whose indptr entry is `start` (indptr[b], read once by the
  // caller), shift = page_shift()
  __device__ __forceinline__ int2 page_slot(int start, int j, int shift) const {
    const int pi = shift >= 0 ? j >> shift : j / page_size;
    const int slot = shift >= 0 ? j & (page_size - 1) : j - pi * page_size;
    return make_int2(__ldg(indices + start + pi), slot);
  }
  // Offset of key row j of the request whose indptr entry is `start`, shift = page_shift(); the value row lies
  // stride_kv further.
  __device__ __forceinline__ int64_t key_offset(int start, int j, int shift) const {
    if (page_size == 0) return int64_t(start + j) * stride_slot;
    const int2 ps = page_slot(start, j, shift);
    return int64_t(ps.x) * stride_page + int64_t(ps.y) * stride_slot;
  }
};

}  // namespace attngen
