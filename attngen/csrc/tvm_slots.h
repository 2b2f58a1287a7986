// TVM PagedKVCache's ("tirx", fn) attention slots on attngen's prefill and tensor-core decode templates,
// with exactly the argument lists TVM 0.27's runtime passes (src/runtime/vm/attn_backend.h:
// TIRPagedPrefillFunc, TIRRaggedPrefillFunc, TIRDecodeFunc), and the parts the ("flashinfer", run, plan)
// functions (tvm_fi_slots.h) share with them. attngen/codegen/cuda_tvm_slots.py says what they compute and
// what they refuse.
//
// A build instantiates TirxSlots<V, T, D, Config> per (head dim, element type) and exports its static
// functions. TVM passes no variant parameters, so the generated Config carries what the call does not:
// `static void fill(V::Params&)` (the variant's scalar parameters, compiled in) and the exported names the
// errors cite (kPrefillPaged, kPrefillRagged, kDecode).
#pragma once
#include <cstddef>
#include <cstdint>

#include "attngen_enums.h"
#include "decode_launch.cuh"
#include "prefill_dispatch.h"
#include "problem_glue.h"

namespace attngen {
namespace tvm_slot {

using tvm::ffi::TensorView;

// The decode functions serve groups of up to this many query heads per KV head.
constexpr int kMaxGroup = 8;

inline void check_no_inline_rope(const char* name, int64_t rotary_mode) {
  if (rotary_mode != 0)
    TVM_FFI_THROW(ValueError) << name << ": rotary_mode " << rotary_mode << " (inline RoPE) is not served by "
        "attngen's CUDA slots; create the cache with RoPE applied before attention (RopeMode NORMAL or NONE)";
}

inline void check_plain_length_info(const char* name, const TensorView& last_page_len) {
  if (last_page_len.ndim() != 1)
    TVM_FFI_THROW(ValueError) << name << ": length_info must be [batch] (sliding-window length_info is not served)";
}

// The variant's parameters as the build compiled them in.
template <class V, class Config>
typename V::Params compiled_params() {
  typename V::Params hp{};
  Config::fill(hp);
  return hp;
}

// Prefill with TVM's conventions: its run-time causal flag on top of the variant's mask, lse -5e4 for rows
// that see no key. `max_qo_len` sizes the grid (query tiles past a request's rows exit at once).
template <class V, class T, int D>
void launch_tvm_prefill(const char* name, PrefillProblem& P, bool causal, int64_t max_qo_len,
                        const typename V::Params& hp, const TensorView& q) {
  P.causal = causal;
  P.tvm_conventions = 1;
  launch_prefill_any<V, T, D>(P, static_cast<int>(max_qo_len), hp, stream_of(q));
  check_launch(name);
}

// Decode on the tensor-core template with TVM's conventions; `set_split(P)` fills the split-KV fields once q's
// stream (and with it q's device) is current.
template <class V, class T, int D, class SetSplit>
void launch_tvm_decode(const char* name, DecodeProblem& P, const typename V::Params& hp, const TensorView& q,
                       SetSplit&& set_split) {
  if (P.group > kMaxGroup)
    TVM_FFI_THROW(ValueError) << name << ": " << P.num_qo_heads << " query heads over " << P.num_kv_heads
                              << " KV heads; groups of 1 to " << kMaxGroup << " are served";
  if (P.batch == 0) return;
  P.backend = static_cast<int>(DecodeBackend::kTensorCores);
  P.tvm_conventions = 1;
  cudaStream_t stream = stream_of(q);  // also makes q's device current for what follows
  set_split(P);
  if (!launch_decode<V, T, D, kMaxGroup>(P, hp, stream))
    TVM_FFI_THROW(ValueError) << name << ": no tensor-core decode tile fits this device's shared memory";
  check_launch(name);
}

// TVM's "tirx" decode gives no key lengths on the host: keys split evenly by a batch-size heuristic, the
// partial states in a per-device scratch buffer.
template <int D>
void split_keys_evenly(const char* name, DecodeProblem& P) {
  P.num_chunks = even_decode_chunks(P.batch, P.num_kv_heads);
  if (P.num_chunks > 1) {
    float* ws = device_scratch(size_t(P.batch) * P.num_chunks * P.num_qo_heads * (D + 1));
    if (ws == nullptr)
      TVM_FFI_THROW(RuntimeError) << name << ": could not allocate the split-KV scratch buffer on the GPU";
    P.part_o = ws;
    P.part_lse = ws + size_t(P.batch) * P.num_chunks * P.num_qo_heads * D;
  }
}

template <class V, class T, int D, class Config>
struct TirxSlots {
  // (q [n, Hq, D], qo_indptr [B+1], pages [P, 2, Hkv, S, D], page_indptr [B+1], page_indices [nnz],
  //  length_info [B] (last page lengths), k_rope_pos_offset [B], q_rope_position [n], o [n, Hq, D], lse [n, Hq],
  //  causal, rotary_mode, rope_scale, rope_theta, sm_scale)
  static void prefill_paged(TensorView q, TensorView qo_indptr, TensorView pages, TensorView indptr,
                            TensorView indices, TensorView last_page_len, TensorView k_rope_pos_offset,
                            TensorView q_rope_position, TensorView o, TensorView lse, int64_t causal,
                            int64_t rotary_mode, double rope_scale, double rope_theta, double sm_scale) {
    const char* name = Config::kPrefillPaged;
    check_no_inline_rope(name, rotary_mode);
    check_plain_length_info(name, last_page_len);
    const typename V::Params hp = compiled_params<V, Config>();
    PrefillProblem P{};
    fill_prefill(P, q, qo_indptr, o, lse, sm_scale,
                 kv_from_pages<KVLayout::kHND>(P.kv, pages, indptr, indices, last_page_len), name);  // TVM's pages are HND
    // TVM gives no host copy of qo_indptr: the grid is sized for the longest possible request (all rows)
    launch_tvm_prefill<V, T, D>(name, P, causal != 0, q.size(0), hp, q);
  }

  // (q, qo_indptr, k [m, Hkv, D], v, kv_indptr [B+1], q_rope_position, k_rope_pos_offset, o, lse, causal,
  //  rotary_mode, rope_scale, rope_theta, sm_scale)
  static void prefill_ragged(TensorView q, TensorView qo_indptr, TensorView k, TensorView v, TensorView kv_indptr,
                             TensorView q_rope_position, TensorView k_rope_pos_offset, TensorView o, TensorView lse,
                             int64_t causal, int64_t rotary_mode, double rope_scale, double rope_theta,
                             double sm_scale) {
    const char* name = Config::kPrefillRagged;
    check_no_inline_rope(name, rotary_mode);
    const typename V::Params hp = compiled_params<V, Config>();
    PrefillProblem P{};
    fill_prefill(P, q, qo_indptr, o, lse, sm_scale, kv_from_ragged<T>(P.kv, k, v, kv_indptr), name);
    launch_tvm_prefill<V, T, D>(name, P, causal != 0, q.size(0), hp, q);
  }

  // (q [B, Hq, D], pages, page_indptr, page_indices, length_info, k_rope_pos_offset, q_rope_position, o, lse,
  //  rotary_mode, rope_scale, rope_theta, sm_scale)
  static void decode(TensorView q, TensorView pages, TensorView indptr, TensorView indices, TensorView last_page_len,
                     TensorView k_rope_pos_offset, TensorView q_rope_position, TensorView o, TensorView lse,
                     int64_t rotary_mode, double rope_scale, double rope_theta, double sm_scale) {
    const char* name = Config::kDecode;
    check_no_inline_rope(name, rotary_mode);
    check_plain_length_info(name, last_page_len);
    const typename V::Params hp = compiled_params<V, Config>();
    DecodeProblem P{};
    fill_decode(P, q, o, lse, sm_scale, kv_from_pages<KVLayout::kHND>(P.kv, pages, indptr, indices, last_page_len), name);
    launch_tvm_decode<V, T, D>(name, P, hp, q, [name](DecodeProblem& p) { split_keys_evenly<D>(name, p); });
  }
};

}  // namespace tvm_slot
}  // namespace attngen
