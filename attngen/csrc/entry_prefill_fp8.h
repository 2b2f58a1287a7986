// The exported prefill / append entries over fp8 K/V (float8_e4m3fn / float8_e5m2), attngen's calling
// convention with the cache's scales: as PrefillPagedEntry / PrefillRaggedEntry (entry_prefill.h) with
//   k_scale [Hkv] or [1] f32, v_scale [Hkv] or [1] f32 (one per KV head, or one for the cache: KVScales)
// after lse. Both templates serve them, chosen as for a 16-bit cache (prefill_dispatch.h): the Hopper one
// (hopper_fp8_stage.cuh) on sm_90a, the mma.sync one (kv_staging.cuh) elsewhere; each stages the fp8 rows and
// widens them into 16-bit tiles. Python emits, per (D, dtype, K/V dtype, layout):
//
//   ATTNGEN_EXPORT_TYPED_FUNC(batch_prefill_paged_nhd_f16_kve4m3_d128,
//       (attngen::PrefillPagedFP8Entry<attngen_gen::Hooks_d128, half, __nv_fp8_e4m3, 128,
//                                      attngen::KVLayout::kNHD, kName>::call));
#pragma once
#include "entry_prefill.h"
#include "fp8_ffi.h"

namespace attngen {

// The launch of both fp8 entries, once P holds the problem.
template <class V, class T, class KV, int D>
void run_prefill_fp8(const char* name, ScaledPrefillProblem& P, const TV& q, const TV& k_scale, const TV& v_scale,
                     const PrefillLaunchArgs& a, const typename V::Params& hp) {
  static_assert(kIsFp8<KV>, "run_prefill_fp8 reads an fp8 cache");
  P.scales = kv_scales_of(name, k_scale, v_scale, P.num_kv_heads);
  if (a.hook_workspace.has_value())
    ATTNGEN_THROW(ValueError) << name << ": hook_workspace: a prefill over an fp8 cache applies the row hooks in its "
                              << "kernels (they see dequantised rows); pass None";
  fill_prefill_launch<V, D>(name, P, q, a);
  launch_prefill_any<V, T, D, KV>(P, static_cast<int>(a.max_qo_len), hp, stream_of(q));
  check_launch(name);
}

template <class V, class T, class KV, int D, KVLayout L, const char* Name, class Extra = typename V::ExtraArgs>
struct PrefillPagedFP8Entry;

template <class V, class T, class KV, int D, KVLayout L, const char* Name, class... X>
struct PrefillPagedFP8Entry<V, T, KV, D, L, Name, ArgList<X...>> {
  static void call(TV q, TV pages, TV indices, TV indptr, TV last_page_len, TV qo_indptr, TV o, TV lse, TV k_scale,
                   TV v_scale, double sm_scale, int64_t max_qo_len, int64_t tile_rows, int64_t kernel,
                   OptionalTensor tile_indptr, OptionalTensor tile_entries, int64_t tile_heads,
                   OptionalTensor work_order, OptionalTensor hook_workspace, X... extra) {
    check_paged_prefill_args<T, KV>(Name, q, pages, indices, indptr, last_page_len, qo_indptr, o, lse,
                                    TensorArg{"k_scale", k_scale, 1, dl_dtype<float>()},
                                    TensorArg{"v_scale", v_scale, 1, dl_dtype<float>()});
    typename V::Params hp{};
    V::set_params(Name, hp, extra...);
    ScaledPrefillProblem P{};
    fill_prefill(P, q, qo_indptr, o, lse, sm_scale,
                 kv_from_pages<L>(P.kv, pages, indptr, indices, last_page_len, 8, D), Name);
    run_prefill_fp8<V, T, KV, D>(Name, P, q, k_scale, v_scale,
                                 {max_qo_len, tile_rows, kernel, tile_indptr, tile_entries, tile_heads, work_order,
                                  hook_workspace},
                                 hp);
  }
};

template <class V, class T, class KV, int D, const char* Name, class Extra = typename V::ExtraArgs>
struct PrefillRaggedFP8Entry;

template <class V, class T, class KV, int D, const char* Name, class... X>
struct PrefillRaggedFP8Entry<V, T, KV, D, Name, ArgList<X...>> {
  static void call(TV q, TV k, TV v, TV kv_indptr, TV qo_indptr, TV o, TV lse, TV k_scale, TV v_scale,
                   double sm_scale, int64_t max_qo_len, int64_t tile_rows, int64_t kernel, OptionalTensor tile_indptr,
                   OptionalTensor tile_entries, int64_t tile_heads, OptionalTensor work_order,
                   OptionalTensor hook_workspace, X... extra) {
    check_ragged_prefill_args<T, KV>(Name, q, k, v, kv_indptr, qo_indptr, o, lse,
                                     TensorArg{"k_scale", k_scale, 1, dl_dtype<float>()},
                                     TensorArg{"v_scale", v_scale, 1, dl_dtype<float>()});
    typename V::Params hp{};
    V::set_params(Name, hp, extra...);
    ScaledPrefillProblem P{};
    fill_prefill(P, q, qo_indptr, o, lse, sm_scale, kv_from_ragged<KV>(P.kv, k, v, kv_indptr), Name);
    run_prefill_fp8<V, T, KV, D>(Name, P, q, k_scale, v_scale,
                                 {max_qo_len, tile_rows, kernel, tile_indptr, tile_entries, tile_heads, work_order,
                                  hook_workspace},
                                 hp);
  }
};

}  // namespace attngen
