// The exported decode entry over an fp8 paged KV cache (float8_e4m3fn / float8_e5m2), attngen's calling
// convention with the cache's scales: as DecodePagedEntry (entry_decode.h) with
//   k_scale [Hkv] or [1] f32, v_scale [Hkv] or [1] f32 (one per KV head, or one for the cache: KVScales)
// after lse. Keys and values are dequantised on load (fp8_kv.cuh) on every arch: the tensor-core template
// stages the fp8 rows and dequantises them into its 16-bit tiles, the CUDA-core one converts as it reads;
// the launcher (decode_launch.cuh launch_decode over KV), backend choice and split-KV plans are as for
// DecodePagedEntry, in whole-program and linked builds alike. Python emits, per (D, dtype, K/V dtype,
// layout):
//
//   ATTNGEN_EXPORT_TYPED_FUNC(batch_decode_paged_nhd_f16_kve4m3_d128,
//       (attngen::DecodePagedFP8Entry<attngen_gen::Hooks_d128, half, __nv_fp8_e4m3, 128,
//                                     attngen::KVLayout::kNHD, 8, kName>::call));
#pragma once
#include "entry_decode.h"
#include "fp8_ffi.h"
#include "fp8_kv.cuh"

namespace attngen {

template <class V, class T, class KV, int D, KVLayout L, int MaxG>
void decode_paged_fp8(const char* name, const DecodeArgs& a, tvm::ffi::TensorView k_scale, tvm::ffi::TensorView v_scale,
                      const typename V::Params& hp) {
  static_assert(kIsFp8<KV>, "decode_paged_fp8 reads an fp8 cache");
  ScaledDecodeProblem P{};
  fill_decode(P, a.q, a.o, a.lse, a.sm_scale,
              kv_from_pages<L>(P.kv, a.pages, a.indptr, a.indices, a.last_page_len, 8, D), name);
  P.scales = kv_scales_of(name, k_scale, v_scale, P.num_kv_heads);
  if (!fill_decode_split<D, MaxG, true>(P, a.split, name)) return;
  check_decode_launch(name, launch_decode<V, T, D, MaxG, KV>(P, hp, stream_of(a.q)));
}

template <class V, class T, class KV, int D, KVLayout L, int MaxG, const char* Name,
          class Extra = typename V::ExtraArgs>
struct DecodePagedFP8Entry;

template <class V, class T, class KV, int D, KVLayout L, int MaxG, const char* Name, class... X>
struct DecodePagedFP8Entry<V, T, KV, D, L, MaxG, Name, ArgList<X...>> {
  static void call(tvm::ffi::TensorView q, tvm::ffi::TensorView pages, tvm::ffi::TensorView indices,
                   tvm::ffi::TensorView indptr, tvm::ffi::TensorView last_page_len, tvm::ffi::TensorView o,
                   tvm::ffi::TensorView lse, tvm::ffi::TensorView k_scale, tvm::ffi::TensorView v_scale,
                   double sm_scale, tvm::ffi::TensorView part_o, tvm::ffi::TensorView part_lse, int64_t num_chunks,
                   int64_t backend, tvm::ffi::Optional<tvm::ffi::TensorView> plan, int64_t plan_ctas,
                   int64_t plan_merges, int64_t kv_heads_per_cta, X... extra) {
    const DecodeArgs args{q, pages, indices, indptr, last_page_len, o, lse, sm_scale,
                          DecodeSplitArgs{part_o, part_lse, num_chunks, backend, plan, plan_ctas, plan_merges,
                                          kv_heads_per_cta}};
    check_decode_args<T, KV>(Name, args, TensorArg{"k_scale", k_scale, 1, dl_dtype<float>()},
                             TensorArg{"v_scale", v_scale, 1, dl_dtype<float>()});
    typename V::Params hp{};
    V::set_params(Name, hp, extra...);
    decode_paged_fp8<V, T, KV, D, L, MaxG>(Name, args, k_scale, v_scale, hp);
  }
};

}  // namespace attngen
