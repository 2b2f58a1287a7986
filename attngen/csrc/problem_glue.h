// Filling the templates' problem structs from TVM-FFI arguments, shared by every exported wrapper
// (attngen's own convention and TVM PagedKVCache's "tirx" and "flashinfer" ones): the KV view from a
// page pool, from K / V page views or from ragged K / V, and the fields every problem has.
#pragma once
#include "decode.cuh"
#include "ffi_glue.h"
#include "kv_rows.cuh"
#include "prefill.cuh"

namespace attngen {

// Where the slot and head axes sit in a page pool [P, 2, ., ., D]: [S, Hkv] (NHD) or [Hkv, S] (HND).
enum class KVLayout { kNHD, kHND };

inline void set_page_table(KVRows& kv, const tvm::ffi::TensorView& indptr, const tvm::ffi::TensorView& indices,
                           const tvm::ffi::TensorView& last_page_len) {
  kv.indptr = static_cast<const int32_t*>(data_of(indptr));
  kv.indices = static_cast<const int32_t*>(data_of(indices));
  kv.last_page_len = static_cast<const int32_t*>(data_of(last_page_len));
}

// Whether a tensor holds no element: its strides say nothing then (DLPack gives an empty tensor's as 0).
inline bool holds_nothing(const tvm::ffi::TensorView& t) {
  for (int d = 0; d < t.ndim(); ++d)
    if (t.size(d) == 0) return true;
  return false;
}

// A page pool the kernels read in place (runtime/checks.py pool_layout_error says why not, by name, before any
// call): rows contiguous, the address and the strides of the other dims (of more than one element) positive
// multiples of 16 bytes. Whether rows overlap is left to the runtime: overlapping rows read, they do not fault.
inline void check_pool_strides(const tvm::ffi::TensorView& pages, int elem_bytes, int head_dim) {
  const int64_t unit = 16 / elem_bytes;
  if (pages.size(1) != 2)
    ATTNGEN_THROW(ValueError) << "pages: dim 1 holds a page's keys and values and must be 2, got " << pages.size(1);
  if (head_dim > 0 && pages.size(4) != head_dim)
    ATTNGEN_THROW(ValueError) << "pages: head_dim " << pages.size(4) << ", this function was built for " << head_dim;
  if (holds_nothing(pages)) return;
  if (pages.size(4) > 1 && pages.stride(4) != 1)
    ATTNGEN_THROW(ValueError) << "pages: rows [head_dim] must be contiguous (stride " << pages.stride(4)
                              << "): pass pages.contiguous()";
  if (reinterpret_cast<uintptr_t>(data_of(pages)) % 16 != 0)
    ATTNGEN_THROW(ValueError) << "pages: must start on a 16-byte aligned address";
  for (int d = 0; d < 4; ++d)
    if (pages.size(d) > 1 && (pages.stride(d) <= 0 || pages.stride(d) % unit != 0))
      ATTNGEN_THROW(ValueError) << "pages: dim " << d << " has stride " << pages.stride(d) << " elements; pages, "
                                << "halves, slots and heads must lie positive multiples of 16 bytes apart: pass "
                                << "pages.contiguous()";
}

// pages [P, 2, S, Hkv, D] (NHD) or [P, 2, Hkv, S, D] (HND) of elem_bits-bit elements (8: an fp8 cache), D the
// function's head_dim where given (> 0); returns the number of KV heads.
inline int kv_from_pages(KVRows& kv, const tvm::ffi::TensorView& pages, bool hnd, const tvm::ffi::TensorView& indptr,
                         const tvm::ffi::TensorView& indices, const tvm::ffi::TensorView& last_page_len,
                         int elem_bits = 16, int head_dim = 0) {
  check_tensor(pages, "pages", 5, {kDLFloat, static_cast<uint8_t>(elem_bits), 1});
  check_pool_strides(pages, elem_bits / 8, head_dim);
  kv.base = data_of(pages);
  set_page_table(kv, indptr, indices, last_page_len);
  kv.stride_page = pages.stride(0);
  kv.stride_kv = pages.stride(1);
  kv.stride_slot = pages.stride(hnd ? 3 : 2);
  kv.stride_head = pages.stride(hnd ? 2 : 3);
  kv.page_size = static_cast<int>(pages.size(hnd ? 3 : 2));
  kv.rows = holds_nothing(pages) ? 0 : pages.size(0);
  return static_cast<int>(pages.size(hnd ? 2 : 3));
}

template <KVLayout L>
int kv_from_pages(KVRows& kv, const tvm::ffi::TensorView& pages, const tvm::ffi::TensorView& indptr,
                  const tvm::ffi::TensorView& indices, const tvm::ffi::TensorView& last_page_len, int elem_bits = 16,
                  int head_dim = 0) {
  return kv_from_pages(kv, pages, L == KVLayout::kHND, indptr, indices, last_page_len, elem_bits, head_dim);
}

// K and V views [P, Hkv, S, D] (HND) of one page pool; returns the number of KV heads.
template <class T>
int kv_from_page_views(KVRows& kv, const tvm::ffi::TensorView& k, const tvm::ffi::TensorView& v,
                       const tvm::ffi::TensorView& indptr, const tvm::ffi::TensorView& indices,
                       const tvm::ffi::TensorView& last_page_len) {
  check_tensor(k, "k", 4, {kDLFloat, 16, 1});
  kv.base = data_of(k);
  set_page_table(kv, indptr, indices, last_page_len);
  kv.stride_page = k.stride(0);
  kv.stride_kv = (static_cast<const char*>(data_of(v)) - static_cast<const char*>(data_of(k))) / int64_t(sizeof(T));
  kv.stride_head = k.stride(1);
  kv.stride_slot = k.stride(2);
  kv.page_size = static_cast<int>(k.size(2));
  kv.rows = holds_nothing(k) ? 0 : k.size(0);
  return static_cast<int>(k.size(1));
}

// Ragged K and V [rows, Hkv, D] of element type T (16-bit, or an fp8 format): rows contiguous, tokens and heads
// 16-byte multiples apart (views of a fused projection may leave gaps), the same strides for both (compared, and
// kept, only along dims above 1, where a stride means something); returns the number of KV heads.
template <class T>
int kv_from_ragged(KVRows& kv, const tvm::ffi::TensorView& k, const tvm::ffi::TensorView& v,
                   const tvm::ffi::TensorView& kv_indptr) {
  constexpr DLDataType bits{kDLFloat, static_cast<uint8_t>(8 * sizeof(T)), 1};
  check_tensor(k, "k", 3, bits);
  check_tensor(v, "v", 3, bits);
  for (int d = 0; d < 3; ++d)
    if (k.size(d) != v.size(d))
      ATTNGEN_THROW(ValueError) << "k, v: shapes differ in dim " << d << " (" << k.size(d) << " vs " << v.size(d)
                                << ")";
  const int64_t packed[3] = {k.size(1) * k.size(2), k.size(2), 1};
  const bool empty = holds_nothing(k);  // (no row to read: its strides, 0 through DLPack, say nothing)
  int64_t stride[3];
  for (int d = 0; d < 3; ++d) {
    stride[d] = k.size(d) > 1 && !empty ? k.stride(d) : packed[d];
    if (k.size(d) > 1 && !empty && v.stride(d) != k.stride(d))
      ATTNGEN_THROW(ValueError) << "k, v: must have the same strides (dim " << d << ": " << k.stride(d) << " vs "
                                << v.stride(d) << ")";
  }
  if (stride[2] != 1 || stride[0] * int64_t(sizeof(T)) % 16 != 0 || stride[1] * int64_t(sizeof(T)) % 16 != 0)
    ATTNGEN_THROW(ValueError) << "k, v: rows must be contiguous and lie a multiple of 16 bytes apart (strides ["
                              << stride[0] << ", " << stride[1] << ", " << stride[2] << "]): pass .contiguous()";
  kv.base = data_of(k);
  kv.indptr = static_cast<const int32_t*>(data_of(kv_indptr));
  kv.stride_kv = (static_cast<const char*>(data_of(v)) - static_cast<const char*>(data_of(k))) / int64_t(sizeof(T));
  kv.stride_slot = stride[0];
  kv.stride_head = stride[1];
  kv.page_size = 0;
  kv.rows = k.size(0);
  return static_cast<int>(k.size(1));
}

// q [n, Hq, D]: a token's heads packed (the view of a fused QKV projection may leave gaps between tokens, a
// multiple of 8 elements so that rows stay 16-byte aligned); o [n, Hq, D] and lse [n, Hq] packed.
inline void check_query_strides(const tvm::ffi::TensorView& q, const tvm::ffi::TensorView& o,
                                const tvm::ffi::TensorView& lse) {
  const int64_t heads = q.size(1), d = q.size(2);
  if (holds_nothing(q)) return;  // (no row to read: its strides, 0 through DLPack, say nothing)
  if (q.size(0) > 1 && (q.stride(0) < heads * d || q.stride(0) % 8 != 0))
    ATTNGEN_THROW(ValueError) << "q: token stride " << q.stride(0) << " elements; it must be at least Hq * D = "
                              << heads * d << " and a multiple of 8 (16-byte rows): pass q.contiguous()";
  if ((heads > 1 && q.stride(1) != d) || (d > 1 && q.stride(2) != 1))
    ATTNGEN_THROW(ValueError) << "q: a token's heads must be packed (strides [*, " << d << ", 1], got [*, "
                              << q.stride(1) << ", " << q.stride(2) << "]): pass q.contiguous()";
  if (o.ndim() == 3 && ((o.size(0) > 1 && o.stride(0) != o.size(1) * o.size(2)) ||
                        (o.size(1) > 1 && o.stride(1) != o.size(2)) || (o.size(2) > 1 && o.stride(2) != 1)))
    ATTNGEN_THROW(ValueError) << "out: must be contiguous";
  if (lse.ndim() == 2 && ((lse.size(0) > 1 && lse.stride(0) != lse.size(1)) || (lse.size(1) > 1 && lse.stride(1) != 1)))
    ATTNGEN_THROW(ValueError) << "lse: must be contiguous";
}

// q [n, Hq, D], o like q, lse [n, Hq]; the group size must divide.
template <class Problem>
void fill_common(Problem& P, const tvm::ffi::TensorView& q, const tvm::ffi::TensorView& o,
                 const tvm::ffi::TensorView& lse, double sm_scale, int num_kv_heads, const char* name) {
  check_tensor(q, "q", 3, {kDLFloat, 16, 1});
  check_query_strides(q, o, lse);
  P.q = data_of(q);
  P.q_stride = q.size(0) > 1 ? q.stride(0) : q.size(1) * q.size(2);  // (a lone row: any stride reads it)
  P.o = data_of(o);
  P.lse = static_cast<float*>(data_of(lse));
  P.num_qo_heads = static_cast<int>(q.size(1));
  P.num_kv_heads = num_kv_heads;
  P.group = num_kv_heads > 0 ? P.num_qo_heads / num_kv_heads : 0;
  P.sm_scale = static_cast<float>(sm_scale);
  if (num_kv_heads <= 0 || P.group * num_kv_heads != P.num_qo_heads)
    ATTNGEN_THROW(ValueError) << name << ": num_qo_heads " << P.num_qo_heads << " is not a multiple of num_kv_heads "
                              << num_kv_heads;
}

// Prefill over requests qo_indptr [B+1].
inline void fill_prefill(PrefillProblem& P, const tvm::ffi::TensorView& q, const tvm::ffi::TensorView& qo_indptr,
                         const tvm::ffi::TensorView& o, const tvm::ffi::TensorView& lse, double sm_scale,
                         int num_kv_heads, const char* name) {
  fill_common(P, q, o, lse, sm_scale, num_kv_heads, name);
  P.qo_indptr = static_cast<const int32_t*>(data_of(qo_indptr));
  P.q_rows = q.size(0);
  P.batch = static_cast<int>(qo_indptr.size(0)) - 1;
}

// Decode: one query row per request, q [B, Hq, D].
inline void fill_decode(DecodeProblem& P, const tvm::ffi::TensorView& q, const tvm::ffi::TensorView& o,
                        const tvm::ffi::TensorView& lse, double sm_scale, int num_kv_heads, const char* name) {
  fill_common(P, q, o, lse, sm_scale, num_kv_heads, name);
  P.batch = static_cast<int>(q.size(0));
}

}  // namespace attngen
