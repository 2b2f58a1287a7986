// The KV view every template reads: paged (a page table over a page pool, NHD or HND by
// strides) or ragged (rows of a contiguous K/V tensor), addressed per request and key.
#pragma once
#include <stdint.h>

namespace attngen {

// Where row j of request b's keys (kv = 0) or values (kv = 1) lives.
struct KVRows {
  const void* base;
  const int32_t* indptr;         // paged: into indices; ragged: into rows
  const int32_t* indices;        // paged: page ids; ragged: nullptr
  const int32_t* last_page_len;  // paged only
  int64_t stride_page, stride_kv, stride_slot, stride_head;  // ragged: stride_slot = row stride
  int page_size;                                             // 0: ragged
  __device__ __forceinline__ int length(int b) const {
    if (page_size == 0) return indptr[b + 1] - indptr[b];
    int n = indptr[b + 1] - indptr[b];
    return n > 0 ? (n - 1) * page_size + last_page_len[b] : 0;
  }
  // Offset of key row j of the request whose indptr entry is `start` (indptr[b], read once by the
  // caller); the value row lies stride_kv further.
  __device__ __forceinline__ int64_t key_offset(int start, int j) const {
    if (page_size == 0) return int64_t(start + j) * stride_slot;
    int page = indices[start + j / page_size];
    return int64_t(page) * stride_page + int64_t(j % page_size) * stride_slot;
  }
};

}  // namespace attngen
