// TVM PagedKVCache's ("tirx", fn) attention slots on attngen's prefill and tensor-core decode templates,
// with exactly the argument lists TVM 0.27's runtime passes (src/runtime/vm/attn_backend.h:
// TIRPagedPrefillFunc, TIRRaggedPrefillFunc, TIRDecodeFunc), and the parts the ("flashinfer", run, plan)
// functions (tvm_fi_slots.h) share with them. attngen/codegen/cuda_tvm_slots.py says what they compute and
// what they refuse.
//
// A build instantiates TirxSlots<V, T, D, Config> per (head dim, element type) and exports its static
// functions. TVM passes no variant parameters, so the generated Config carries what the call does not:
// `TensorArgs` and `fill` (tvm_slot_params.h: the variant's scalar parameters compiled in; its tensor parameters,
// if any, as trailing arguments of every function, after TVM's, in declaration order), the exported names the
// errors cite (kPrefillPaged, kPrefillRagged, kDecode, kPrefillPagedSlidingWindow, kDecodeSlidingWindow) and
// what the sliding-window functions serve, kSlidingWindow: -1 nothing (they refuse a call and no windowed
// kernel is instantiated), 0 per-sequence windows with attention sinks, W > 0 also the window of "mha_sliding"
// layers (tvm_window.cuh). The two token-tree functions (kPrefillRaggedTree, kPrefillPagedTree) run instances
// with TVM's tree mask compiled in (tvm_tree.cuh) on the mma.sync template; the paged one serves "mha_sliding"
// layers (length_info [3, B]) where kSlidingWindow > 0. kInlineRope: whether the library serves TVM's inline
// RoPE (rotary_mode 1) in the prefill, decode and sliding-window functions, with TvmRope<V> instances on the
// mma.sync prefill and tensor-core decode templates (tvm_rope.cuh); without it those refuse rotary_mode 1. The
// tree functions never serve it (TVM refuses token trees under inline RoPE).
#pragma once
#include <cstddef>
#include <cstdint>

#include "attngen_enums.h"
#include "decode_launch.cuh"
#include "prefill_dispatch.h"
#include "problem_glue.h"
#include "tvm_rope.cuh"
#include "tvm_slot_params.h"
#include "tvm_tree.cuh"
#include "tvm_window.cuh"

namespace attngen {
namespace tvm_slot {

using tvm::ffi::TensorView;

// The decode functions serve groups of up to this many query heads per KV head.
constexpr int kMaxGroup = 8;

// The tree functions: TVM's cache refuses token trees under inline RoPE, and so do they.
inline void check_no_inline_rope(const char* name, int64_t rotary_mode) {
  if (rotary_mode != 0)
    ATTNGEN_THROW(ValueError) << name << ": rotary_mode " << rotary_mode << " (inline RoPE) is not served by "
        "attngen's token-tree slots (TVM's cache refuses token trees under inline RoPE); create the cache with "
        "RoPE applied before attention (RopeMode NORMAL or NONE)";
}

// Whether a call asks for TVM's inline RoPE (rotary_mode 1), which only a library built for it serves.
template <class Config>
bool wants_inline_rope(const char* name, int64_t rotary_mode) {
  if (rotary_mode != 0 && rotary_mode != 1)
    ATTNGEN_THROW(ValueError) << name << ": rotary_mode " << rotary_mode << " is not TVM's (0 none, 1 inline)";
  if (rotary_mode == 1 && !Config::kInlineRope)
    ATTNGEN_THROW(ValueError) << name << ": rotary_mode 1 (inline RoPE) is not served by this library: it was "
        "built without RoPE kernels (BuildConfig.tvm_rope False); build it for the cache's RoPE (attngen.tvm "
        "does so from a CacheShape whose inline_rope is set)";
  return rotary_mode == 1;
}


inline void check_plain_length_info(const char* name, const TensorView& last_page_len) {
  if (last_page_len.ndim() != 1)
    ATTNGEN_THROW(ValueError) << name << ": length_info must be [batch] (sliding-window length_info is not served)";
}

// TVM's sliding-window view: length_info [3, B] int32 = (last page lengths, window offsets, sink sizes), whose
// first row kv_from_pages takes as the last page lengths (checked before any other argument).
inline void set_sliding_view(const char* name, KVRows& kv, const TensorView& length_info) {
  if (length_info.ndim() != 2 || length_info.size(0) != 3 || length_info.dtype() != dl_dtype<int32_t>() ||
      !length_info.IsContiguous())
    ATTNGEN_THROW(ValueError) << name << ": length_info must be a contiguous int32 [3, batch] (last page lengths, "
                                 "sliding-window offsets, sink sizes)";
  const int32_t* rows = static_cast<const int32_t*>(data_of(length_info));
  kv.window_offset = rows + length_info.size(1);
  kv.sink = rows + 2 * length_info.size(1);
}

// TVM's positions of a sliding-window call: query rows at q_rope_position, key j of request b at
// k_rope_pos_offset[b] + j; `window` > 0 hides keys that many positions or more before the query (the window of
// "mha_sliding" layers), `causal` keys after it.
inline PositionWindow position_window(const TensorView& q_rope_position, const TensorView& k_rope_pos_offset,
                                      int window, bool causal) {
  return {static_cast<const int32_t*>(data_of(q_rope_position)),
          static_cast<const int32_t*>(data_of(k_rope_pos_offset)), window, causal ? 1 : 0};
}

// TVM's positions and run-time RoPE scalars of an inline-RoPE call (the layer window and causal flag as given).
template <class Problem>
void set_rope(Problem& P, const TensorView& q_rope_position, const TensorView& k_rope_pos_offset, double rope_scale,
              double rope_theta, int window = 0, bool causal = false) {
  P.win = position_window(q_rope_position, k_rope_pos_offset, window, causal);
  P.rope = {float(rope_scale), float(rope_theta)};
}

inline void refuse_sliding_window(const char* name) {
  ATTNGEN_THROW(ValueError) << name << ": this library was built without sliding-window kernels (BuildConfig."
                               "tvm_window None); build it for the cache's windows (attngen.tvm does so from a "
                               "CacheShape with support_sliding_window or 'mha_sliding' layers)";
}

// The variant's parameters for one call (Config::fill): the compiled-in scalars and the call's trailing tensors,
// checked against the call's sizes (P filled from TVM's arguments, q its query rows).
template <class V, class Config, int D, class Problem, class... X>
typename V::Params slot_params(const char* name, const Problem& P, const TensorView& q, const X&... tensors) {
  typename V::Params hp{};
  Config::fill(name, SlotCall{q.device().device_id, P.batch, P.num_qo_heads, P.num_kv_heads, D, q.size(0)}, hp,
               tensors...);
  return hp;
}

// Prefill with TVM's conventions: its run-time causal flag on top of the variant's mask, lse -5e4 for rows
// that see no key. `max_qo_len` sizes the grid (query tiles past a request's rows exit at once).
template <class V, class T, int D>
void launch_tvm_prefill(const char* name, PrefillProblem& P, bool causal, int64_t max_qo_len,
                        const typename V::Params& hp, const TensorView& q) {
  P.causal = causal;
  P.tvm_conventions = 1;
  launch_prefill_auto<V, T, D>(P, static_cast<int>(max_qo_len), hp, stream_of(q));
  check_launch(name);
}

// Inline-RoPE prefill (W: the traits, TvmWindowed<V> for the sliding-window function) on the mma.sync template
// (no Hopper instance), P.win and P.rope set (set_rope).
template <class W, class T, int D>
void launch_tvm_rope_prefill(const char* name, PrefillProblem& P, bool causal, int64_t max_qo_len,
                             const typename W::Params& hp, const TensorView& q) {
  P.causal = causal;
  P.tvm_conventions = 1;
  P.kernel = static_cast<int>(PrefillTemplate::kMmaSync);
  launch_prefill<TvmRope<W>, T, D>(P, static_cast<int>(max_qo_len), hp, stream_of(q));
  check_launch(name);
}

// TVM's tree arrays: tree_mn_indptr int32 [B+1] (B + 1 = qo_indptr's length), tree_order int32 [nodes, 2]
// (tvm_tree.cuh), CUDA tensors; checked before any other argument but rotary_mode.
inline TreeMask tree_mask(const char* name, const TensorView& qo_indptr, const TensorView& tree_mn_indptr,
                          const TensorView& tree_order) {
  if (tree_mn_indptr.ndim() != 1 || qo_indptr.ndim() != 1 || tree_mn_indptr.size(0) != qo_indptr.size(0) ||
      tree_mn_indptr.dtype() != dl_dtype<int32_t>() || !tree_mn_indptr.IsContiguous())
    ATTNGEN_THROW(ValueError) << name << ": tree_mn_indptr must be a contiguous int32 [batch + 1]";
  // (TVM's CUDA cache passes [nodes, 2] views of its merged aux buffer; its plain aux manager a flat [2 * nodes])
  const bool pairs = tree_order.ndim() == 2 ? tree_order.size(1) == 2
                                            : tree_order.ndim() == 1 && tree_order.size(0) % 2 == 0;
  if (!pairs || tree_order.dtype() != dl_dtype<int32_t>() || !tree_order.IsContiguous())
    ATTNGEN_THROW(ValueError) << name << ": tree_order must be a contiguous int32 [tree nodes, 2] (or [2 * nodes])";
  if (tree_mn_indptr.device().device_type != kDLCUDA || tree_order.device().device_type != kDLCUDA)
    ATTNGEN_THROW(ValueError) << name << ": tree_mn_indptr and tree_order must be CUDA tensors";
  return {static_cast<const int32_t*>(data_of(tree_mn_indptr)), static_cast<const int32_t*>(data_of(tree_order))};
}

// Token-tree prefill (W: the traits, TvmWindowed<V> on "mha_sliding" layers) on the mma.sync template: TVM's tree
// mask instead of a causal flag; the in-call causal bound the tree implies for a request with a tree (a node's
// ancestors precede it) lets the template skip the tiles past the diagonal. Tree forwards are small: no Hopper
// instance.
template <class W, class T, int D>
void launch_tvm_tree_prefill(const char* name, PrefillProblem& P, const TreeMask& tree, int64_t max_qo_len,
                             const typename W::Params& hp, const TensorView& q) {
  P.tree = tree;
  P.causal = 0;  // (the tree instances take their causal bound per request from the tree: prefill.cuh)
  P.tvm_conventions = 1;
  P.kernel = static_cast<int>(PrefillTemplate::kMmaSync);
  launch_prefill<TvmTree<W>, T, D>(P, static_cast<int>(max_qo_len), hp, stream_of(q));
  check_launch(name);
}

// Decode on the tensor-core template with TVM's conventions; `set_split(P, stream)` fills the split-KV fields once
// q's stream (and with it q's device) is current, and returns a scratch buffer the launch then frees in stream
// order (a CUDA graph's own allocation: split_keys_evenly), else nullptr.
template <class V, class T, int D, class SetSplit>
void launch_tvm_decode(const char* name, DecodeProblem& P, const typename V::Params& hp, const TensorView& q,
                       SetSplit&& set_split) {
  if (P.group > kMaxGroup)
    ATTNGEN_THROW(ValueError) << name << ": " << P.num_qo_heads << " query heads over " << P.num_kv_heads
                              << " KV heads; groups of 1 to " << kMaxGroup << " are served";
  if (P.batch == 0) return;
  P.backend = static_cast<int>(DecodeBackend::kTensorCores);
  P.tvm_conventions = 1;
  cudaStream_t stream = stream_of(q);  // also makes q's device current for what follows
  float* graph_scratch = set_split(P, stream);  // (a scratch the graph being captured owns: freed below)
  bool launched;
  // (no CUDA-core instance for inline RoPE, nor where every device holds a tensor-core tile)
  if constexpr (tvm_rope<V>() || decode_tc_fits_every_device<D, T>())
    launched = try_launch_decode_tc<V, T, D>(P, hp, stream);
  else
    launched = launch_decode<V, T, D, kMaxGroup>(P, hp, stream);
  if (graph_scratch != nullptr) cudaFreeAsync(graph_scratch, stream);  // after the merge, in stream order
  if (!launched)
    ATTNGEN_THROW(ValueError) << name << ": no tensor-core decode tile fits this device's shared memory";
  check_launch(name);
}

// Resident CTAs per SM of the tensor-core decode kernel on the current device, asked once per device.
template <class V, class T, int D>
int decode_tc_ctas_per_sm_cached() {
  static int by_device[64] = {0};  // 0: not asked yet; -1: no tile fits
  int dev = 0;
  cudaGetDevice(&dev);
  int& n = by_device[dev & 63];
  if (n == 0) {
    const int m = decode_tc_ctas_per_sm<V, T, D>();
    n = m > 0 ? m : -1;
  }
  return n > 0 ? n : 0;
}

// TVM's "tirx" decode gives no key lengths on the host: keys split evenly into as many chunks as fill the
// device's CTA slots once (device_info.cuh even_decode_chunks), the partial states in a per-device scratch
// buffer; while `stream` is being captured into a CUDA graph (TVM's or PyTorch's), where cudaMalloc and cudaFree
// may not run, in a stream-ordered allocation of the graph's own, returned for the caller to free after the
// launch (else nullptr). V: the variant type the decode kernel is launched with.
template <class V, class T, int D>
float* split_keys_evenly(const char* name, DecodeProblem& P, cudaStream_t stream) {
  P.num_chunks = even_decode_chunks(P.batch, P.num_kv_heads, decode_tc_ctas_per_sm_cached<V, T, D>());
  if (P.num_chunks <= 1) return nullptr;
  const size_t floats = size_t(P.batch) * P.num_chunks * P.num_qo_heads * (D + 1);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  float* owned = nullptr;
  float* ws = nullptr;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();  // (not left for check_launch to report as the kernels' error)
    capture = cudaStreamCaptureStatusNone;
  }
  if (capture == cudaStreamCaptureStatusActive) {
    if (cudaMallocAsync(reinterpret_cast<void**>(&owned), floats * sizeof(float), stream) != cudaSuccess) {
      cudaGetLastError();
      ATTNGEN_THROW(RuntimeError) << name << ": could not allocate the split-KV scratch buffer in the CUDA graph "
                                  << "being captured (a stream-ordered allocation: the device needs memory pools)";
    }
    ws = owned;
  } else {
    ws = device_scratch(floats);
    if (ws == nullptr)
      ATTNGEN_THROW(RuntimeError) << name << ": could not allocate the split-KV scratch buffer on the GPU";
  }
  P.part_o = ws;
  P.part_lse = ws + size_t(P.batch) * P.num_chunks * P.num_qo_heads * D;
  return owned;
}

template <class V, class T, int D, class Config, class Tensors = typename Config::TensorArgs>
struct TirxSlots;

// X: a TensorView per tensor parameter of the variant, the trailing arguments of every function
template <class V, class T, int D, class Config, class... X>
struct TirxSlots<V, T, D, Config, ArgList<X...>> {
  // The "tirx" decode's even split-KV (split_keys_evenly) for a launch of the variant type W.
  template <class W>
  static auto even_split(const char* name) {
    return [name](DecodeProblem& p, cudaStream_t stream) { return split_keys_evenly<W, T, D>(name, p, stream); };
  }

  // (q [n, Hq, D], qo_indptr [B+1], pages [P, 2, Hkv, S, D], page_indptr [B+1], page_indices [nnz],
  //  length_info [B] (last page lengths), k_rope_pos_offset [B], q_rope_position [n], o [n, Hq, D], lse [n, Hq],
  //  causal, rotary_mode, rope_scale, rope_theta, sm_scale)
  static void prefill_paged(TensorView q, TensorView qo_indptr, TensorView pages, TensorView indptr,
                            TensorView indices, TensorView last_page_len, TensorView k_rope_pos_offset,
                            TensorView q_rope_position, TensorView o, TensorView lse, int64_t causal,
                            int64_t rotary_mode, double rope_scale, double rope_theta, double sm_scale, X... extra) {
    const char* name = Config::kPrefillPaged;
    [[maybe_unused]] const bool rope = wants_inline_rope<Config>(name, rotary_mode);
    check_plain_length_info(name, last_page_len);
    PrefillProblem P{};
    fill_prefill(P, q, qo_indptr, o, lse, sm_scale,
                 kv_from_pages<KVLayout::kHND>(P.kv, pages, indptr, indices, last_page_len), name);  // TVM's pages are HND
    const typename V::Params hp = slot_params<V, Config, D>(name, P, q, extra...);
    // TVM gives no host copy of qo_indptr: the grid is sized for the longest possible request (all rows)
    if constexpr (Config::kInlineRope) {
      if (rope) {
        set_rope(P, q_rope_position, k_rope_pos_offset, rope_scale, rope_theta);
        return launch_tvm_rope_prefill<V, T, D>(name, P, causal != 0, q.size(0), hp, q);
      }
    }
    launch_tvm_prefill<V, T, D>(name, P, causal != 0, q.size(0), hp, q);
  }

  // (q, qo_indptr, k [m, Hkv, D], v, kv_indptr [B+1], q_rope_position, k_rope_pos_offset, o, lse, causal,
  //  rotary_mode, rope_scale, rope_theta, sm_scale)
  static void prefill_ragged(TensorView q, TensorView qo_indptr, TensorView k, TensorView v, TensorView kv_indptr,
                             TensorView q_rope_position, TensorView k_rope_pos_offset, TensorView o, TensorView lse,
                             int64_t causal, int64_t rotary_mode, double rope_scale, double rope_theta,
                             double sm_scale, X... extra) {
    const char* name = Config::kPrefillRagged;
    [[maybe_unused]] const bool rope = wants_inline_rope<Config>(name, rotary_mode);
    PrefillProblem P{};
    fill_prefill(P, q, qo_indptr, o, lse, sm_scale, kv_from_ragged<T>(P.kv, k, v, kv_indptr), name);
    const typename V::Params hp = slot_params<V, Config, D>(name, P, q, extra...);
    if constexpr (Config::kInlineRope) {
      if (rope) {  // key j of request b at k_rope_pos_offset[b] + j, as in the paged function
        set_rope(P, q_rope_position, k_rope_pos_offset, rope_scale, rope_theta);
        return launch_tvm_rope_prefill<V, T, D>(name, P, causal != 0, q.size(0), hp, q);
      }
    }
    launch_tvm_prefill<V, T, D>(name, P, causal != 0, q.size(0), hp, q);
  }

  // (q [B, Hq, D], pages, page_indptr, page_indices, length_info, k_rope_pos_offset, q_rope_position, o, lse,
  //  rotary_mode, rope_scale, rope_theta, sm_scale)
  static void decode(TensorView q, TensorView pages, TensorView indptr, TensorView indices, TensorView last_page_len,
                     TensorView k_rope_pos_offset, TensorView q_rope_position, TensorView o, TensorView lse,
                     int64_t rotary_mode, double rope_scale, double rope_theta, double sm_scale, X... extra) {
    const char* name = Config::kDecode;
    [[maybe_unused]] const bool rope = wants_inline_rope<Config>(name, rotary_mode);
    check_plain_length_info(name, last_page_len);
    DecodeProblem P{};
    fill_decode(P, q, o, lse, sm_scale, kv_from_pages<KVLayout::kHND>(P.kv, pages, indptr, indices, last_page_len), name);
    const typename V::Params hp = slot_params<V, Config, D>(name, P, q, extra...);
    if constexpr (Config::kInlineRope) {
      if (rope) {
        set_rope(P, q_rope_position, k_rope_pos_offset, rope_scale, rope_theta);
        return launch_tvm_decode<TvmRope<V>, T, D>(name, P, hp, q, even_split<TvmRope<V>>(name));
      }
    }
    launch_tvm_decode<V, T, D>(name, P, hp, q, even_split<V>(name));
  }

  // prefill_paged's arguments with length_info [3, B]: request b's keys through TVM's sliding-window view, its
  // query rows at TVM's positions, causal comparing those (tvm_window.cuh)
  static void prefill_paged_sliding_window(TensorView q, TensorView qo_indptr, TensorView pages, TensorView indptr,
                                           TensorView indices, TensorView length_info, TensorView k_rope_pos_offset,
                                           TensorView q_rope_position, TensorView o, TensorView lse, int64_t causal,
                                           int64_t rotary_mode, double rope_scale, double rope_theta,
                                           double sm_scale, X... extra) {
    const char* name = Config::kPrefillPagedSlidingWindow;
    if constexpr (Config::kSlidingWindow < 0) {
      refuse_sliding_window(name);
    } else {
      [[maybe_unused]] const bool rope = wants_inline_rope<Config>(name, rotary_mode);
      PrefillProblem P{};
      set_sliding_view(name, P.kv, length_info);
      fill_prefill(P, q, qo_indptr, o, lse, sm_scale,
                   kv_from_pages<KVLayout::kHND>(P.kv, pages, indptr, indices, length_info), name);
      const typename V::Params hp = slot_params<V, Config, D>(name, P, q, extra...);
      P.win = position_window(q_rope_position, k_rope_pos_offset, Config::kSlidingWindow, causal != 0);
      if constexpr (Config::kInlineRope) {
        if (rope) {  // keys rotated at their positions in the view
          set_rope(P, q_rope_position, k_rope_pos_offset, rope_scale, rope_theta, Config::kSlidingWindow, causal != 0);
          return launch_tvm_rope_prefill<TvmWindowed<V>, T, D>(name, P, false, q.size(0), hp, q);
        }
      }
      // the causal flag applies at TVM's positions (P.win); the in-call one is off
      launch_tvm_prefill<TvmWindowed<V>, T, D>(name, P, false, q.size(0), hp, q);
    }
  }

  // (q, qo_indptr, k, v, kv_indptr, q_rope_position, tree_mn_indptr [B+1], tree_order [nodes, 2], o, lse,
  //  rotary_mode, rope_scale, rope_theta, sm_scale): request b's k / v rows end with its tree, its query rows are
  //  the tree's last nodes (tvm_tree.cuh). The variant's hooks read no positions: q_rope_position is not read.
  static void prefill_ragged_tree(TensorView q, TensorView qo_indptr, TensorView k, TensorView v,
                                  TensorView kv_indptr, TensorView q_rope_position, TensorView tree_mn_indptr,
                                  TensorView tree_order, TensorView o, TensorView lse, int64_t rotary_mode,
                                  double rope_scale, double rope_theta, double sm_scale, X... extra) {
    const char* name = Config::kPrefillRaggedTree;
    check_no_inline_rope(name, rotary_mode);
    const TreeMask tree = tree_mask(name, qo_indptr, tree_mn_indptr, tree_order);
    PrefillProblem P{};
    fill_prefill(P, q, qo_indptr, o, lse, sm_scale, kv_from_ragged<T>(P.kv, k, v, kv_indptr), name);
    const typename V::Params hp = slot_params<V, Config, D>(name, P, q, extra...);
    launch_tvm_tree_prefill<V, T, D>(name, P, tree, q.size(0), hp, q);
  }

  // (q, qo_indptr, pages, page_indptr, page_indices, length_info, k_rope_pos_offset, q_rope_position, o, lse,
  //  rotary_mode, rope_scale, rope_theta, sm_scale, tree_mn_indptr, tree_order): the tree is the last keys of
  //  request b's pages. TVM calls it for every layer: length_info [B] ("mha"), or [3, B] ("mha_sliding": the
  //  sliding-window view and the layer window at TVM's positions, as prefill_paged_sliding_window).
  static void prefill_paged_tree(TensorView q, TensorView qo_indptr, TensorView pages, TensorView indptr,
                                 TensorView indices, TensorView length_info, TensorView k_rope_pos_offset,
                                 TensorView q_rope_position, TensorView o, TensorView lse, int64_t rotary_mode,
                                 double rope_scale, double rope_theta, double sm_scale, TensorView tree_mn_indptr,
                                 TensorView tree_order, X... extra) {
    const char* name = Config::kPrefillPagedTree;
    check_no_inline_rope(name, rotary_mode);
    if (length_info.ndim() != 1 && Config::kSlidingWindow <= 0)
      ATTNGEN_THROW(ValueError) << name << ": length_info [3, batch] (an 'mha_sliding' layer) needs tree kernels "
                                   "with the layer window; build the library with BuildConfig.tvm_window = the "
                                   "window (attngen.tvm does so from a CacheShape with 'mha_sliding' layers)";
    const TreeMask tree = tree_mask(name, qo_indptr, tree_mn_indptr, tree_order);
    PrefillProblem P{};
    if (length_info.ndim() == 1) {
      fill_prefill(P, q, qo_indptr, o, lse, sm_scale,
                   kv_from_pages<KVLayout::kHND>(P.kv, pages, indptr, indices, length_info), name);
      const typename V::Params hp = slot_params<V, Config, D>(name, P, q, extra...);
      launch_tvm_tree_prefill<V, T, D>(name, P, tree, q.size(0), hp, q);
    } else if constexpr (Config::kSlidingWindow > 0) {
      set_sliding_view(name, P.kv, length_info);
      fill_prefill(P, q, qo_indptr, o, lse, sm_scale,
                   kv_from_pages<KVLayout::kHND>(P.kv, pages, indptr, indices, length_info), name);
      const typename V::Params hp = slot_params<V, Config, D>(name, P, q, extra...);
      P.win = position_window(q_rope_position, k_rope_pos_offset, Config::kSlidingWindow, false);
      launch_tvm_tree_prefill<TvmWindowed<V>, T, D>(name, P, tree, q.size(0), hp, q);
    }
  }

  // decode's arguments with length_info [3, B] (see prefill_paged_sliding_window; no causal flag)
  static void decode_sliding_window(TensorView q, TensorView pages, TensorView indptr, TensorView indices,
                                    TensorView length_info, TensorView k_rope_pos_offset, TensorView q_rope_position,
                                    TensorView o, TensorView lse, int64_t rotary_mode, double rope_scale,
                                    double rope_theta, double sm_scale, X... extra) {
    const char* name = Config::kDecodeSlidingWindow;
    if constexpr (Config::kSlidingWindow < 0) {
      refuse_sliding_window(name);
    } else {
      [[maybe_unused]] const bool rope = wants_inline_rope<Config>(name, rotary_mode);
      DecodeProblem P{};
      set_sliding_view(name, P.kv, length_info);
      fill_decode(P, q, o, lse, sm_scale,
                  kv_from_pages<KVLayout::kHND>(P.kv, pages, indptr, indices, length_info), name);
      const typename V::Params hp = slot_params<V, Config, D>(name, P, q, extra...);
      P.win = position_window(q_rope_position, k_rope_pos_offset, Config::kSlidingWindow, false);
      if constexpr (Config::kInlineRope) {
        if (rope) {
          set_rope(P, q_rope_position, k_rope_pos_offset, rope_scale, rope_theta, Config::kSlidingWindow, false);
          return launch_tvm_decode<TvmRope<TvmWindowed<V>>, T, D>(name, P, hp, q,
                                                                  even_split<TvmRope<TvmWindowed<V>>>(name));
        }
      }
      launch_tvm_decode<TvmWindowed<V>, T, D>(name, P, hp, q, even_split<TvmWindowed<V>>(name));
    }
  }
};

}  // namespace tvm_slot
}  // namespace attngen
