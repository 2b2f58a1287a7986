// TVM-FFI export of the split-KV planner: callable from Python and from a TVM runtime.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <chrono>
#include <cstring>

#include "decode_plan_pack.h"
#include "planner.h"

namespace {

void copy_out(const std::vector<int32_t>& src, tvm::ffi::TensorView dst, const char* name) {
  if (dst.ndim() != 1 || dst.size(0) < int64_t(src.size()))
    TVM_FFI_THROW(ValueError) << name << ": output buffer holds " << dst.size(0) << " entries, the plan needs "
                              << src.size();
  if (!src.empty()) std::memcpy(static_cast<char*>(dst.data_ptr()) + dst.byte_offset(), src.data(), src.size() * 4);
}

// Returns [num_work_items, num_partials, num_merges, chunk_limit, plan_nanoseconds].
tvm::ffi::Array<int64_t> plan_split_kv(tvm::ffi::TensorView qo_len, tvm::ffi::TensorView kv_len, int64_t group,
                                       int64_t tile_rows, int64_t num_ctas, double alpha, double beta,
                                       int64_t fixed_chunk, bool has_lower, int64_t mask_lower, bool has_upper,
                                       int64_t mask_upper, int64_t max_work_items, int64_t max_partials,
                                       int64_t max_merge_tiles, tvm::ffi::TensorView cta_indptr,
                                       tvm::ffi::TensorView work, tvm::ffi::TensorView merge_tiles,
                                       tvm::ffi::TensorView merge_indptr, tvm::ffi::TensorView merge_partials,
                                       int64_t min_chunk) {
  auto t0 = std::chrono::steady_clock::now();
  if (qo_len.ndim() != 1 || kv_len.ndim() != 1 || qo_len.size(0) != kv_len.size(0))
    TVM_FFI_THROW(ValueError) << "qo_len, kv_len: expected two int32 vectors of batch_size entries";
  attngen::PlanInput in{static_cast<const int32_t*>(qo_len.data_ptr()), static_cast<const int32_t*>(kv_len.data_ptr()),
                        int(qo_len.size(0)), int(group), int(tile_rows), int(num_ctas), alpha, beta, fixed_chunk,
                        has_lower, has_upper, int32_t(mask_lower), int32_t(mask_upper), min_chunk};
  attngen::Plan p;
  try {
    p = attngen::plan_split_kv(in, {max_work_items, max_partials, max_merge_tiles});
  } catch (const std::exception& e) {
    TVM_FFI_THROW(ValueError) << e.what();
  }
  // work items as rows of 5: request, query tile, kv start, kv end, partial slot (-1: direct)
  std::vector<int32_t> w;
  w.reserve(p.work_request.size() * 5);
  for (size_t i = 0; i < p.work_request.size(); ++i) {
    w.insert(w.end(), {p.work_request[i], p.work_qtile[i], p.work_kv_start[i], p.work_kv_end[i], p.work_partial[i]});
  }
  std::vector<int32_t> m;
  for (size_t i = 0; i < p.merge_request.size(); ++i) m.insert(m.end(), {p.merge_request[i], p.merge_qtile[i]});
  copy_out(p.cta_indptr, cta_indptr, "cta_indptr");
  copy_out(w, work, "work");
  copy_out(m, merge_tiles, "merge_tiles");
  copy_out(p.merge_indptr, merge_indptr, "merge_indptr");
  copy_out(p.merge_partials, merge_partials, "merge_partials");
  int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  return tvm::ffi::Array<int64_t>({int64_t(p.work_request.size()), int64_t(p.merge_partials.size()),
                                   int64_t(p.merge_request.size()), p.chunk_limit, ns});
}

// The decode plan packed the way TVM's ("flashinfer", run, plan) decode slot packs it (decode_plan_pack.h):
// writes buf (int32) and returns [entries written, merges].
tvm::ffi::Array<int64_t> plan_decode_packed(tvm::ffi::TensorView kv_len, int64_t group, int64_t num_ctas,
                                            double alpha, double beta, int64_t fixed_chunk, int64_t min_chunk,
                                            int64_t max_work_items, int64_t max_partials, int64_t max_merges,
                                            tvm::ffi::TensorView buf) {
  if (kv_len.ndim() != 1) TVM_FFI_THROW(ValueError) << "kv_len: expected an int32 vector of batch_size entries";
  attngen::Plan p;
  try {
    p = attngen::plan_decode(static_cast<const int32_t*>(kv_len.data_ptr()), int(kv_len.size(0)), int(group),
                             int(num_ctas), alpha, beta, fixed_chunk, min_chunk,
                             {max_work_items, max_partials, max_merges});
  } catch (const std::exception& e) {
    TVM_FFI_THROW(ValueError) << e.what();
  }
  const int64_t need = attngen::pack_decode_plan(p, int(num_ctas), nullptr);
  if (buf.ndim() != 1 || buf.size(0) < need)
    TVM_FFI_THROW(ValueError) << "buf: holds " << buf.size(0) << " entries, the packed plan needs " << need;
  attngen::pack_decode_plan(p, int(num_ctas), static_cast<int32_t*>(buf.data_ptr()));
  return tvm::ffi::Array<int64_t>({need, int64_t(p.merge_request.size())});
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(plan_split_kv, plan_split_kv);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(plan_decode_packed, plan_decode_packed);
