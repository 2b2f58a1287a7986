// TVM PagedKVCache's ("flashinfer", run, plan) attention slots on attngen's templates, with exactly the
// argument lists TVM 0.27's runtime passes to FlashInfer's plan and run functions.
//
// TVM calls plan once per step with host index arrays and run per layer with the workspaces. The decode plan
// is attngen's load-balanced split-KV work list (planner.h), packed into TVM's page-locked buffer and copied
// to its int workspace; the prefill plan records the longest request so the grid fits the batch, and makes a
// paged step of one query per request a split-KV decode plan that the paged prefill run executes on the
// decode template (TVM routes decode steps of GQA groups >= 4 through paged prefill in this convention).
//
// A build instantiates FlashInferSlots<V, T, D, Config> per (head dim, element type) and exports its static
// functions. The generated Config carries `TensorArgs` and `fill` (tvm_slot_params.h: the variant's scalar
// parameters compiled in; its tensor parameters, if any, as trailing arguments of the run functions, after TVM's,
// in declaration order; the plan functions take none), the decode cost model the planner weighs work with
// (kDecodeCostAlpha, kDecodeCostBeta, kDecodeMinChunk, kDecodeTinyChunk: attngen/schedules/cost_model.py) and the exported names the
// errors cite (kDecodePlan, kDecodeRun, kPrefillPlan, kPrefillPagedRun, kPrefillRaggedRun).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <vector>

#include "decode_plan_pack.h"
#include "tvm_slots.h"

namespace attngen {
namespace tvm_slot {

using PlanInfo = tvm::ffi::Array<int64_t>;

// plan_info of a prefill plan that made a decode step (one query per request, paged KV) a split-KV decode:
// [1, CTAs per KV head, merges, partial states, num_qo_heads]
constexpr int64_t kDecodeInPrefillPlanInfo = 5;

// A decode plan's fields start at plan_info[first]: CTAs per KV head, merges, partial states.
template <int D>
void split_keys_by_plan(DecodeProblem& P, const TensorView& float_ws, const TensorView& int_ws,
                        const PlanInfo& plan_info, int64_t first) {
  P.num_chunks = 1;
  P.plan = static_cast<const int32_t*>(data_of(int_ws));
  P.plan_ctas = static_cast<int>(plan_info[first]);
  P.plan_max_merges = static_cast<int>(plan_info[first + 1]);
  P.part_o = static_cast<float*>(data_of(float_ws));
  P.part_lse = P.part_o + plan_info[first + 2] * P.num_qo_heads * D;
}

inline void check_run_layout(const char* name, int64_t layout, int64_t expected, const char* what,
                             int64_t window_left) {
  if (layout != expected) ATTNGEN_THROW(ValueError) << name << ": " << what << " (layout code " << expected << ")";
  if (window_left != -1) ATTNGEN_THROW(ValueError) << name << ": sliding windows are not served";
}

inline void check_prefill_run(const char* name, int64_t mask_mode, const PlanInfo& plan_info) {
  if (mask_mode != 0 && mask_mode != 1)
    ATTNGEN_THROW(ValueError) << name << ": mask mode " << mask_mode << " is not served (0: none, 1: causal)";
  if (plan_info.size() < 1) ATTNGEN_THROW(ValueError) << name << ": plan_info is not from this library's plan";
}

template <class V, class T, int D, class Config, class Tensors = typename Config::TensorArgs>
struct FlashInferSlots;

// X: a TensorView per tensor parameter of the variant, the trailing arguments of the run functions
template <class V, class T, int D, class Config, class... X>
struct FlashInferSlots<V, T, D, Config, ArgList<X...>> {
  // attngen's load-balanced split-KV decode plan for requests of kv_len[b] keys (one query each), packed into
  // the page-locked buffer and copied to the int workspace; returns [CTAs per KV head, merges, partial states],
  // or all zeros where no tensor-core decode tile fits the device (nothing is planned then).
  static std::array<int64_t, 3> plan_split_decode(const char* name, const TensorView& float_ws,
                                                  const TensorView& int_ws, const TensorView& locked_ws,
                                                  const int32_t* kv_len, int64_t batch, int64_t num_qo_heads,
                                                  int64_t num_kv_heads) {
    cudaSetDevice(float_ws.device().device_id);
    const int per_sm = decode_tc_ctas_per_sm<V, T, D>();
    if (per_sm == 0) return {0, 0, 0};
    const int ctas = std::max<int>(1, per_sm * device_sm_count() / int(num_kv_heads));
    Plan p;
    try {
      p = plan_decode(kv_len, int(batch), int(num_qo_heads / num_kv_heads), ctas, Config::kDecodeCostAlpha,
                      Config::kDecodeCostBeta, 0,
                      decode_chunk_floor(kv_len, int(batch), ctas, Config::kDecodeMinChunk, Config::kDecodeTinyChunk),
                      {batch + ctas, batch + ctas, batch});
    } catch (const std::exception& e) {
      ATTNGEN_THROW(ValueError) << name << ": " << e.what();
    }
    const int64_t ints = pack_decode_plan(p, ctas, nullptr);
    const int64_t partials = int64_t(p.merge_partials.size());
    if (int_ws.numel() * (int_ws.dtype().bits / 8) < ints * 4 ||
        locked_ws.numel() * (locked_ws.dtype().bits / 8) < ints * 4)
      ATTNGEN_THROW(ValueError) << name << ": the int workspaces hold fewer than the plan's " << ints * 4 << " bytes";
    if (float_ws.numel() * (float_ws.dtype().bits / 8) < partials * num_qo_heads * (D + 1) * 4)
      ATTNGEN_THROW(ValueError) << name << ": the float workspace is smaller than the plan's partial states";
    int32_t* host = static_cast<int32_t*>(data_of(locked_ws));
    pack_decode_plan(p, ctas, host);
    cudaMemcpyAsync(data_of(int_ws), host, size_t(ints) * 4, cudaMemcpyHostToDevice, stream_of(float_ws));
    return {int64_t(ctas), int64_t(p.merge_request.size()), partials};
  }

  // plan_info of the decode plan: [CTAs per KV head, merges, partial states, num_qo_heads]
  static PlanInfo decode_plan(TensorView float_ws, TensorView int_ws, TensorView locked_ws, TensorView page_indptr,
                              int64_t batch, int64_t num_qo_heads, int64_t num_kv_heads, int64_t page_size,
                              bool enable_cuda_graph, int64_t window_left, double logits_soft_cap,
                              int64_t qk_head_dim, int64_t v_head_dim, TensorView empty_q, TensorView empty_kv) {
    const char* name = Config::kDecodePlan;
    if (qk_head_dim != D || v_head_dim != D)
      ATTNGEN_THROW(ValueError) << name << ": built for head_dim " << D << ", asked for " << qk_head_dim;
    if (window_left != -1 || logits_soft_cap != 0.0)
      ATTNGEN_THROW(ValueError) << name << ": sliding windows and FlashInfer's soft cap are not served (write the "
                                   "soft cap as the variant's logits hook)";
    if (num_kv_heads <= 0 || num_qo_heads % num_kv_heads || num_qo_heads / num_kv_heads > kMaxGroup)
      ATTNGEN_THROW(ValueError) << name << ": groups of 1 to " << kMaxGroup << " query heads per KV head are served";
    const int32_t* ip = static_cast<const int32_t*>(data_of(page_indptr));
    std::vector<int32_t> kv_len(batch);
    for (int64_t b = 0; b < batch; ++b) kv_len[b] = (ip[b + 1] - ip[b]) * int32_t(page_size);  // keys <= pages x size
    const auto info = plan_split_decode(name, float_ws, int_ws, locked_ws, kv_len.data(), batch, num_qo_heads,
                                        num_kv_heads);
    if (info[0] == 0) ATTNGEN_THROW(ValueError) << name << ": no tensor-core decode tile fits this device";
    return PlanInfo({info[0], info[1], info[2], num_qo_heads});
  }

  static void decode_run(TensorView float_ws, TensorView int_ws, PlanInfo plan_info, TensorView q, TensorView k,
                         TensorView v, TensorView indptr, TensorView indices, TensorView last_page_len, TensorView o,
                         TensorView lse, int64_t layout, int64_t window_left, bool enable_pdl, double sm_scale,
                         double rope_rcp_scale, double rope_rcp_theta, X... extra) {
    const char* name = Config::kDecodeRun;
    check_run_layout(name, layout, 1, "paged KV must be HND", window_left);
    if (plan_info.size() != 4 || plan_info[3] != q.size(1))
      ATTNGEN_THROW(ValueError) << name << ": plan_info is not from this library's decode plan for these heads";
    DecodeProblem P{};
    fill_decode(P, q, o, lse, sm_scale, kv_from_page_views<T>(P.kv, k, v, indptr, indices, last_page_len), name);
    const typename V::Params hp = slot_params<V, Config, D>(name, P, q, extra...);
    launch_tvm_decode<V, T, D>(name, P, hp, q, [&](DecodeProblem& p, cudaStream_t) -> float* {
      split_keys_by_plan<D>(p, float_ws, int_ws, plan_info, 0);
      return nullptr;  // (the partial states in TVM's float workspace)
    });
  }

  // plan_info of the prefill plan: [longest request's query rows] (sizes the grid; no split-KV), or, for a paged
  // step of one query per request, [1, CTAs per KV head, merges, partial states, num_qo_heads] (a split-KV decode)
  static PlanInfo prefill_plan(TensorView float_ws, TensorView int_ws, TensorView locked_ws, TensorView qo_indptr,
                               TensorView kv_indptr, TensorView kv_len, int64_t total_qo_len, int64_t batch,
                               int64_t num_qo_heads, int64_t num_kv_heads, int64_t page_size, bool enable_cuda_graph,
                               int64_t qk_head_dim, int64_t v_head_dim, bool causal, int64_t window_left,
                               int64_t fixed_split_size, bool disable_split_kv, int64_t num_colocated_ctas) {
    const char* name = Config::kPrefillPlan;
    if (qk_head_dim != D || v_head_dim != D) ATTNGEN_THROW(ValueError) << name << ": built for head_dim " << D;
    if (window_left != -1) ATTNGEN_THROW(ValueError) << name << ": sliding windows are not served";
    const int32_t* qo = static_cast<const int32_t*>(data_of(qo_indptr));
    int64_t longest = 0;
    for (int64_t b = 0; b < batch; ++b) longest = std::max<int64_t>(longest, qo[b + 1] - qo[b]);
    // TVM sends decode steps of GQA groups >= 4 through paged prefill (page_size > 1; its ragged plan passes 1):
    // one query per request becomes attngen's split-KV tensor-core decode, whose plan balances long contexts
    // (where the decode tile does not fit the device, the step stays a prefill)
    if (page_size > 1 && batch > 0 && total_qo_len == batch && longest == 1 && num_kv_heads > 0 &&
        num_qo_heads % num_kv_heads == 0 && num_qo_heads / num_kv_heads <= kMaxGroup) {
      const auto info = plan_split_decode(name, float_ws, int_ws, locked_ws,
                                          static_cast<const int32_t*>(data_of(kv_len)), batch, num_qo_heads,
                                          num_kv_heads);
      if (info[0] > 0) return PlanInfo({1, info[0], info[1], info[2], num_qo_heads});
    }
    return PlanInfo({longest});
  }

  static void prefill_paged_run(TensorView float_ws, TensorView int_ws, PlanInfo plan_info, TensorView q,
                                TensorView k, TensorView v, TensorView qo_indptr, TensorView indptr,
                                TensorView indices, TensorView last_page_len, TensorView o, TensorView lse,
                                int64_t mask_mode, int64_t layout, int64_t window_left, bool enable_pdl,
                                double sm_scale, double rope_rcp_scale, double rope_rcp_theta, X... extra) {
    const char* name = Config::kPrefillPagedRun;
    check_run_layout(name, layout, 1, "paged KV must be HND", window_left);
    check_prefill_run(name, mask_mode, plan_info);
    if (plan_info.size() == kDecodeInPrefillPlanInfo) {  // a decode step planned as split-KV decode
      if (plan_info[4] != q.size(1) || q.size(0) != qo_indptr.size(0) - 1)
        ATTNGEN_THROW(ValueError) << name << ": the decode plan_info is not for this batch and these heads";
      DecodeProblem P{};
      fill_decode(P, q, o, lse, sm_scale, kv_from_page_views<T>(P.kv, k, v, indptr, indices, last_page_len), name);
      const typename V::Params hp = slot_params<V, Config, D>(name, P, q, extra...);
      launch_tvm_decode<V, T, D>(name, P, hp, q, [&](DecodeProblem& p, cudaStream_t) -> float* {
        split_keys_by_plan<D>(p, float_ws, int_ws, plan_info, 1);
        return nullptr;
      });
      return;
    }
    PrefillProblem P{};
    fill_prefill(P, q, qo_indptr, o, lse, sm_scale,
                 kv_from_page_views<T>(P.kv, k, v, indptr, indices, last_page_len), name);
    const typename V::Params hp = slot_params<V, Config, D>(name, P, q, extra...);
    launch_tvm_prefill<V, T, D>(name, P, mask_mode == 1, plan_info[0], hp, q);
  }

  static void prefill_ragged_run(TensorView float_ws, TensorView int_ws, PlanInfo plan_info, TensorView q,
                                 TensorView k, TensorView v, TensorView qo_indptr, TensorView kv_indptr, TensorView o,
                                 TensorView lse, int64_t mask_mode, int64_t layout, int64_t window_left,
                                 bool enable_pdl, double sm_scale, double rope_rcp_scale, double rope_rcp_theta,
                                 X... extra) {
    const char* name = Config::kPrefillRaggedRun;
    check_run_layout(name, layout, 0, "ragged K/V must be NHD", window_left);
    check_prefill_run(name, mask_mode, plan_info);
    PrefillProblem P{};
    fill_prefill(P, q, qo_indptr, o, lse, sm_scale, kv_from_ragged<T>(P.kv, k, v, kv_indptr), name);
    const typename V::Params hp = slot_params<V, Config, D>(name, P, q, extra...);
    launch_tvm_prefill<V, T, D>(name, P, mask_mode == 1, plan_info[0], hp, q);
  }
};

}  // namespace tvm_slot
}  // namespace attngen
