// The exported prefill / append entries of attngen's own calling convention (runtime/cuda.py calls
// them), as templates over the variant traits V, the element type T, the head dim D, the page layout L
// (paged K/V) and the exported name (for error messages). Python emits one explicit export per
// (D, dtype, K/V source) (codegen/cuda_entries.py):
//
//   TVM_FFI_DLL_EXPORT_TYPED_FUNC(batch_prefill_ragged_f16_d128,
//       (attngen::PrefillRaggedEntry<attngen_gen::Hooks_d128, half, 128, kName>::call));
//
// Arguments, all tensors on one CUDA device (the current stream is used):
//   paged:  q [n, Hq, D], pages, indices [nnz], indptr [B+1], last_page_len [B], qo_indptr [B+1], ...
//   ragged: q [n, Hq, D], k [m, Hkv, D], v [m, Hkv, D], kv_indptr [B+1], qo_indptr [B+1], ...
//   ... o [n, Hq, D], lse [n, Hq] f32, sm_scale, max_qo_len (sizes the grid), tile_rows (PrefillTileRows),
//   kernel (PrefillTemplate: which template serves the call),
//   then the variant's extra parameters (V::ExtraArgs).
#pragma once
#include "attngen_enums.h"
#include "prefill_dispatch.h"
#include "problem_glue.h"
#include "variant_params.h"

namespace attngen {

inline bool is_prefill_tile_rows(int64_t v) {
  return v == int64_t(PrefillTileRows::kAuto) || v == int64_t(PrefillTileRows::kRows64) ||
         v == int64_t(PrefillTileRows::kRows128);
}

// The launch shared by the paged and ragged entries, once P holds the problem.
template <class V, class T, int D>
void run_prefill(const char* name, PrefillProblem& P, const tvm::ffi::TensorView& q, int64_t max_qo_len,
                 int64_t tile_rows, int64_t kernel, const typename V::Params& hp) {
  if (!is_prefill_tile_rows(tile_rows))
    TVM_FFI_THROW(ValueError) << name << ": tile_rows must be 0 (the library's choice), 64 or 128";
  if (!is_prefill_template(kernel))
    TVM_FFI_THROW(ValueError) << name << ": kernel must be a PrefillTemplate (0 auto, 1 mma.sync, 2 Hopper)";
  if (const char* why = prefill_template_problem(static_cast<int>(kernel)))
    TVM_FFI_THROW(ValueError) << name << ": " << why << "; plan with the default template";
  P.tile_rows = static_cast<int>(tile_rows);
  P.kernel = static_cast<int>(kernel);
  launch_prefill_any<V, T, D>(P, static_cast<int>(max_qo_len), hp, stream_of(q));
  check_launch(name);
}

template <class V, class T, int D, KVLayout L, const char* Name, class Extra = typename V::ExtraArgs>
struct PrefillPagedEntry;

template <class V, class T, int D, KVLayout L, const char* Name, class... X>
struct PrefillPagedEntry<V, T, D, L, Name, ArgList<X...>> {
  static void call(tvm::ffi::TensorView q, tvm::ffi::TensorView pages, tvm::ffi::TensorView indices,
                   tvm::ffi::TensorView indptr, tvm::ffi::TensorView last_page_len, tvm::ffi::TensorView qo_indptr,
                   tvm::ffi::TensorView o, tvm::ffi::TensorView lse, double sm_scale, int64_t max_qo_len,
                   int64_t tile_rows, int64_t kernel, X... extra) {
    check_args(Name, {{"q", q, 3, dl_dtype<T>()},
                      {"pages", pages, 5, dl_dtype<T>()},
                      {"indices", indices, 1, dl_dtype<int32_t>()},
                      {"indptr", indptr, 1, dl_dtype<int32_t>()},
                      {"last_page_len", last_page_len, 1, dl_dtype<int32_t>()},
                      {"qo_indptr", qo_indptr, 1, dl_dtype<int32_t>()},
                      {"o", o, 3, dl_dtype<T>()},
                      {"lse", lse, 2, dl_dtype<float>()}});
    typename V::Params hp{};
    V::set_params(Name, hp, extra...);
    PrefillProblem P{};
    fill_prefill(P, q, qo_indptr, o, lse, sm_scale, kv_from_pages<L>(P.kv, pages, indptr, indices, last_page_len),
                 Name);
    run_prefill<V, T, D>(Name, P, q, max_qo_len, tile_rows, kernel, hp);
  }
};

template <class V, class T, int D, const char* Name, class Extra = typename V::ExtraArgs>
struct PrefillRaggedEntry;

template <class V, class T, int D, const char* Name, class... X>
struct PrefillRaggedEntry<V, T, D, Name, ArgList<X...>> {
  static void call(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView v,
                   tvm::ffi::TensorView kv_indptr, tvm::ffi::TensorView qo_indptr, tvm::ffi::TensorView o,
                   tvm::ffi::TensorView lse, double sm_scale, int64_t max_qo_len, int64_t tile_rows, int64_t kernel,
                   X... extra) {
    check_args(Name, {{"q", q, 3, dl_dtype<T>()},
                      {"k", k, 3, dl_dtype<T>()},
                      {"v", v, 3, dl_dtype<T>()},
                      {"kv_indptr", kv_indptr, 1, dl_dtype<int32_t>()},
                      {"qo_indptr", qo_indptr, 1, dl_dtype<int32_t>()},
                      {"o", o, 3, dl_dtype<T>()},
                      {"lse", lse, 2, dl_dtype<float>()}});
    typename V::Params hp{};
    V::set_params(Name, hp, extra...);
    PrefillProblem P{};
    fill_prefill(P, q, qo_indptr, o, lse, sm_scale, kv_from_ragged<T>(P.kv, k, v, kv_indptr), Name);
    run_prefill<V, T, D>(Name, P, q, max_qo_len, tile_rows, kernel, hp);
  }
};

}  // namespace attngen
