// The exported decode entry of attngen's own calling convention (runtime/cuda.py calls it), as a
// template over the variant traits V, the element type T, the head dim D, the page layout L, the
// build's group bound MaxG and the exported name (for error messages). Python emits one explicit
// export per (D, dtype, layout) (codegen/cuda_entries.py):
//
//   ATTNGEN_EXPORT_TYPED_FUNC(batch_decode_paged_nhd_f16_d128,
//       (attngen::DecodePagedEntry<attngen_gen::Hooks_d128, half, 128, attngen::KVLayout::kNHD, 8, kName>::call));
//
// Arguments, all tensors on one CUDA device (the current stream is used):
//   q [B, Hq, D], pages [P, 2, S, Hkv, D] (NHD) / [P, 2, Hkv, S, D] (HND), indices [nnz], indptr [B+1],
//   last_page_len [B], o [B, Hq, D], lse [B, Hq] f32, sm_scale,
//   the split (runtime/cuda.py DecodeLaunch): part_o, part_lse f32, num_chunks, backend (DecodeBackend),
//   plan (None, or the device copy of a split-KV plan, runtime/decode_plan.py), plan_ctas, plan_merges,
//   kv_heads_per_cta (1, or 2: KV-head pairs, decode_tc_tile.cuh decode_tc_pairs_kv_heads),
//   then the variant's extra parameters (V::ExtraArgs).
// Without a plan the keys split evenly into num_chunks chunks: part_o [B, C, Hq, D], part_lse [B, C, Hq]
// (unused for one chunk) and plan_ctas = plan_merges = 0. With a plan num_chunks is ignored, the grid is
// (plan_ctas, Hkv / kv_heads_per_cta), part_o / part_lse are [slots, Hq, (D)], and plan_merges merge blocks follow.
// A plan is made for the grid's rows (plan_decode: Hkv / 2 heads of twice the group with kv_heads_per_cta 2, its
// fused merge's counters sized for those rows): call with the kv_heads_per_cta it was made for.
// backend kAuto lets the launcher choose, kCudaCores forces the CUDA-core template, kTensorCores the
// tensor-core one (which falls back to CUDA cores where the device's shared memory holds none of its tiles).
#pragma once
#include "attngen_enums.h"
#include "decode_launch.cuh"
#include "problem_glue.h"
#include "variant_params.h"

namespace attngen {

// The split-KV part of a decode call, as the runtime's DecodeLaunch groups it.
struct DecodeSplitArgs {
  tvm::ffi::TensorView part_o, part_lse;
  int64_t num_chunks;
  int64_t backend;  // a DecodeBackend, checked before use
  tvm::ffi::Optional<tvm::ffi::TensorView> plan;
  int64_t plan_ctas, plan_merges;
  int64_t kv_heads_per_cta;  // 1, or 2: KV-head pairs (tensor-core template, decode_tc_pairs_kv_heads)
};

// A decode call's own arguments (the variant's extra parameters aside).
struct DecodeArgs {
  tvm::ffi::TensorView q, pages, indices, indptr, last_page_len, o, lse;
  double sm_scale;
  DecodeSplitArgs split;
};

inline bool is_decode_backend(int64_t v) {
  return v == int64_t(DecodeBackend::kAuto) || v == int64_t(DecodeBackend::kCudaCores) ||
         v == int64_t(DecodeBackend::kTensorCores);
}

// Element types, ranks and devices of the call's tensors, before the variant's parameters are read: queries
// and outputs of T, pages of KV (T itself, or an fp8 format: entry_decode_fp8.h), and the entry's own
// tensors after lse (an fp8 entry's scales), all types checked before any device.
template <class T, class KV = T, class... Own>
void check_decode_args(const char* name, const DecodeArgs& a, const Own&... own) {
  check_args(name, {{"q", a.q, 3, dl_dtype<T>()},
                    {"pages", a.pages, 5, dl_dtype<KV>()},
                    {"indices", a.indices, 1, dl_dtype<int32_t>()},
                    {"indptr", a.indptr, 1, dl_dtype<int32_t>()},
                    {"last_page_len", a.last_page_len, 1, dl_dtype<int32_t>()},
                    {"o", a.o, 3, dl_dtype<T>()},
                    {"lse", a.lse, 2, dl_dtype<float>()},
                    own...,
                    {"part_o", a.split.part_o, -1, dl_dtype<float>()},
                    {"part_lse", a.split.part_lse, -1, dl_dtype<float>()}});
  if (a.split.plan.has_value())
    check_args(name, {{"plan", *a.split.plan, 1, dl_dtype<int32_t>()}}, a.q.device().device_id);
}

// The split-KV arguments into P (any decode problem type; kFp8: an fp8 cache's) and their checks against the
// library's bounds; false when the batch is empty (nothing to launch).
template <int D, int MaxG, bool kFp8 = false, class Problem>
bool fill_decode_split(Problem& P, const DecodeSplitArgs& split, const char* name) {
  P.part_o = static_cast<float*>(data_of(split.part_o));
  P.part_lse = static_cast<float*>(data_of(split.part_lse));
  P.num_chunks = static_cast<int>(split.num_chunks);
  P.backend = static_cast<int>(split.backend);
  if (split.plan.has_value()) {
    if (split.plan_ctas < 1 || split.plan_merges < 0)
      ATTNGEN_THROW(ValueError) << name << ": with a plan, plan_ctas must be at least 1 and plan_merges at least 0";
    P.plan = static_cast<const int32_t*>(data_of(*split.plan));
    P.plan_ctas = static_cast<int>(split.plan_ctas);
    P.plan_max_merges = static_cast<int>(split.plan_merges);
  } else if (split.plan_ctas != 0 || split.plan_merges != 0) {
    ATTNGEN_THROW(ValueError) << name << ": plan_ctas / plan_merges describe a plan; without one pass 0";
  }
  const bool tensor_cores = split.backend != int64_t(DecodeBackend::kCudaCores);
  if (P.group > MaxG && !tensor_cores)
    ATTNGEN_THROW(ValueError) << name << ": group size " << P.num_qo_heads << "/" << P.num_kv_heads
                              << " is not served by the CUDA-core template, built for max_group_size=" << MaxG
                              << "; the tensor-core template serves any group (backend 0 or 2)";
  // a group above the tensor-core tile's rows: parts of it on CTA rows of their own (decode_tc_group_parts)
  if (tensor_cores) P.group_parts = decode_tc_group_parts(P.group);
  if (split.kv_heads_per_cta != 1 && split.kv_heads_per_cta != 2)
    ATTNGEN_THROW(ValueError) << name << ": kv_heads_per_cta must be 1 or 2, got " << split.kv_heads_per_cta;
  if (split.kv_heads_per_cta == 2) {
    if (!decode_tc_pairs_kv_heads<D, kFp8>())
      ATTNGEN_THROW(ValueError) << name << ": kv_heads_per_cta=2 pairs KV heads whose rows are at most 128 bytes "
                                << "(an fp8 cache at head_dim <= 128, a 16-bit one at head_dim 64); pass 1";
    if (P.num_kv_heads % 2 != 0 || 2 * P.group > DecodeTCTile<D, 1>::kMaxGroup)
      ATTNGEN_THROW(ValueError) << name << ": kv_heads_per_cta=2 needs an even number of KV heads and a group of at "
                                << "most " << DecodeTCTile<D, 1>::kMaxGroup / 2 << " (got " << P.num_kv_heads
                                << " KV heads, group " << P.group << "); pass 1";
    if (split.backend == int64_t(DecodeBackend::kCudaCores))
      ATTNGEN_THROW(ValueError) << name << ": kv_heads_per_cta=2 runs on the tensor-core template; backend 1 (CUDA "
                                << "cores) takes kv_heads_per_cta=1";
    P.kv_head_shift = 1;
  }
  if (P.batch == 0) return false;
  if (P.num_chunks < 1) ATTNGEN_THROW(ValueError) << name << ": num_chunks must be at least 1";
  if (!is_decode_backend(split.backend))
    ATTNGEN_THROW(ValueError) << name << ": backend must be 0 (automatic), 1 (CUDA cores) or 2 (tensor cores)";
  if (!P.plan && P.num_chunks > 1 &&
      (split.part_o.numel() < int64_t(P.batch) * P.num_chunks * P.num_qo_heads * D ||
       split.part_lse.numel() < int64_t(P.batch) * P.num_chunks * P.num_qo_heads))
    ATTNGEN_THROW(ValueError) << name << ": part_o / part_lse are smaller than batch x num_chunks x heads";
  return true;
}

// After a decode launcher ran (launched: whether it found a template for the call): the errors of the launch.
inline void check_decode_launch(const char* name, bool launched) {
  if (!launched)
    ATTNGEN_THROW(ValueError) << name << ": no tensor-core decode tile fits this device's shared memory, and a "
                                         "split-KV plan, KV-head pairs or a group above max_group_size need one; "
                                         "plan with tensor_cores=False (and a group within max_group_size)";
  check_launch(name);
}

template <class V, class T, int D, KVLayout L, int MaxG>
void decode_paged(const char* name, const DecodeArgs& a, const typename V::Params& hp) {
  DecodeProblem P{};
  const int kv_heads = kv_from_pages<L>(P.kv, a.pages, a.indptr, a.indices, a.last_page_len, 16, D);
  fill_decode(P, a.q, a.o, a.lse, a.sm_scale, kv_heads, name);
  if (!fill_decode_split<D, MaxG>(P, a.split, name)) return;
  check_decode_launch(name, launch_decode<V, T, D, MaxG>(P, hp, stream_of(a.q)));
}

template <class V, class T, int D, KVLayout L, int MaxG, const char* Name, class Extra = typename V::ExtraArgs>
struct DecodePagedEntry;

template <class V, class T, int D, KVLayout L, int MaxG, const char* Name, class... X>
struct DecodePagedEntry<V, T, D, L, MaxG, Name, ArgList<X...>> {
  static void call(tvm::ffi::TensorView q, tvm::ffi::TensorView pages, tvm::ffi::TensorView indices,
                   tvm::ffi::TensorView indptr, tvm::ffi::TensorView last_page_len, tvm::ffi::TensorView o,
                   tvm::ffi::TensorView lse, double sm_scale, tvm::ffi::TensorView part_o,
                   tvm::ffi::TensorView part_lse, int64_t num_chunks, int64_t backend,
                   tvm::ffi::Optional<tvm::ffi::TensorView> plan, int64_t plan_ctas, int64_t plan_merges,
                   int64_t kv_heads_per_cta, X... extra) {
    const DecodeArgs args{q, pages, indices, indptr, last_page_len, o, lse, sm_scale,
                          DecodeSplitArgs{part_o, part_lse, num_chunks, backend, plan, plan_ctas, plan_merges,
                                          kv_heads_per_cta}};
    check_decode_args<T>(Name, args);
    typename V::Params hp{};
    V::set_params(Name, hp, extra...);
    decode_paged<V, T, D, L, MaxG>(Name, args, hp);
  }
};

}  // namespace attngen
