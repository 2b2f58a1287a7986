// The exported decode entry over an fp8 paged KV cache (float8_e4m3fn / float8_e5m2), attngen's calling
// convention with the cache's scales: as DecodePagedEntry (entry_decode.h) with
//   k_scale [Hkv] f32, v_scale [Hkv] f32 (the runtime expands a per-tensor scale)
// after lse. Keys and values are dequantised on load (fp8_kv.cuh) on every arch: the tensor-core template
// stages the fp8 rows and dequantises them into its 16-bit tiles, the CUDA-core one converts as it reads;
// the backend choice and split-KV plans are as for DecodePagedEntry. Python emits, per (D, dtype, K/V dtype,
// layout):
//
//   TVM_FFI_DLL_EXPORT_TYPED_FUNC(batch_decode_paged_nhd_f16_kve4m3_d128,
//       (attngen::DecodePagedFP8Entry<attngen_gen::Hooks_d128, half, __nv_fp8_e4m3, 128,
//                                     attngen::KVLayout::kNHD, 8, kName>::call));
#pragma once
#include "entry_decode.h"
#include "fp8_ffi.h"
#include "fp8_kv.cuh"

namespace attngen {

template <class V, class T, class KV, int D, int G>
void launch_decode_fp8_tile(const ScaledDecodeProblem& P, const typename V::Params& hp, cudaStream_t stream) {
  using Tile = DecodeTile<D, G>;
  const size_t smem = decode_smem_bytes<V, T, D, G, KV>();
  auto kernel = decode_kernel<V, T, D, G, KV>;
  if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  kernel<<<dim3(P.num_chunks, P.num_kv_heads, P.batch), dim3(Tile::kLanes, G, Tile::kZ), smem, stream>>>(P, hp);
  launch_decode_merge<V, T, D>(P, hp, stream);  // partial states are float32 whatever the cache holds
}

template <class V, class T, class KV, int D, int S>
void launch_decode_fp8_tc_tile(const ScaledDecodeProblem& P, const typename V::Params& hp, cudaStream_t stream) {
  const size_t smem = decode_tc_smem_bytes<D, S, true>();
  auto kernel = decode_tc_kernel<V, T, D, S, KV>;
  if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  const dim3 grid = P.plan ? dim3(P.plan_ctas, P.num_kv_heads, 1) : dim3(P.num_chunks, P.num_kv_heads, P.batch);
  launch_dependent(kernel, grid, dim3(DecodeTCTile<D, S>::kThreads), smem, stream, P, hp);
  launch_decode_merge<V, T, D>(P, hp, stream);
}

// The tensor-core template with the deepest pipeline the device's shared memory holds (the fp8 staging
// area included); false when none fits.
template <class V, class T, class KV, int D>
bool try_launch_decode_fp8_tc(const ScaledDecodeProblem& P, const typename V::Params& hp, cudaStream_t stream) {
  constexpr int S = decode_tc_stages<D>();
  const size_t optin = size_t(device_smem_optin());
  if (optin >= decode_tc_smem_bytes<D, S, true>()) return launch_decode_fp8_tc_tile<V, T, KV, D, S>(P, hp, stream), true;
  if constexpr (S > 2) {
    if (optin >= decode_tc_smem_bytes<D, 2, true>()) return launch_decode_fp8_tc_tile<V, T, KV, D, 2>(P, hp, stream), true;
  }
  if (optin >= decode_tc_smem_bytes<D, 1, true>()) return launch_decode_fp8_tc_tile<V, T, KV, D, 1>(P, hp, stream), true;
  return false;
}

// As launch_decode: tensor cores unless the call asks for CUDA cores; false when a plan-mode call finds no
// tensor-core tile that fits.
template <class V, class T, class KV, int D, int MaxG>
bool launch_decode_fp8(const ScaledDecodeProblem& P, const typename V::Params& hp, cudaStream_t stream) {
  static_assert(kIsFp8<KV>, "launch_decode_fp8 reads an fp8 cache");
  if (decode_wants_tensor_cores(P) && try_launch_decode_fp8_tc<V, T, KV, D>(P, hp, stream)) return true;
  if (P.plan != nullptr) return false;
  if (P.group <= 1) return launch_decode_fp8_tile<V, T, KV, D, 1>(P, hp, stream), true;
  if constexpr (MaxG >= 2) if (P.group <= 2) return launch_decode_fp8_tile<V, T, KV, D, 2>(P, hp, stream), true;
  if constexpr (MaxG >= 4) if (P.group <= 4) return launch_decode_fp8_tile<V, T, KV, D, 4>(P, hp, stream), true;
  if constexpr (MaxG >= 8) launch_decode_fp8_tile<V, T, KV, D, 8>(P, hp, stream);
  return true;
}

template <class V, class T, class KV, int D, KVLayout L, int MaxG>
void decode_paged_fp8(const char* name, const DecodeArgs& a, tvm::ffi::TensorView k_scale, tvm::ffi::TensorView v_scale,
                      const typename V::Params& hp) {
  ScaledDecodeProblem P{};
  fill_decode(P, a.q, a.o, a.lse, a.sm_scale,
              kv_from_pages<L>(P.kv, a.pages, a.indptr, a.indices, a.last_page_len, 8), name);
  P.scales = kv_scales_of(name, k_scale, v_scale, P.num_kv_heads);
  if (!fill_decode_split<D, MaxG>(P, a.split, name)) return;
  check_decode_launch(name, launch_decode_fp8<V, T, KV, D, MaxG>(P, hp, stream_of(a.q)));
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
                   int64_t plan_merges, X... extra) {
    const DecodeArgs args{q, pages, indices, indptr, last_page_len, o, lse, sm_scale,
                          DecodeSplitArgs{part_o, part_lse, num_chunks, backend, plan, plan_ctas, plan_merges}};
    check_decode_args<T, KV>(Name, args, TensorArg{"k_scale", k_scale, 1, dl_dtype<float>()},
                             TensorArg{"v_scale", v_scale, 1, dl_dtype<float>()});
    typename V::Params hp{};
    V::set_params(Name, hp, extra...);
    decode_paged_fp8<V, T, KV, D, L, MaxG>(Name, args, k_scale, v_scale, hp);
  }
};

}  // namespace attngen
