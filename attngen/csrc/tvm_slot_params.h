// The variant's parameters in TVM's slot calls (tvm_slots.h, tvm_fi_slots.h). TVM's arguments carry none, so a
// build compiles the scalar parameters in and the exported functions take the tensor parameters as trailing
// TensorView arguments in declaration order (attngen.tvm binds them to every call; a variant without tensor
// parameters adds none). The generated Config (codegen/cuda_tvm_slots.py) declares
//
//   using TensorArgs = attngen::ArgList<tvm::ffi::TensorView>;  // one per tensor parameter
//   static void fill(const char* entry, const attngen::tvm_slot::SlotCall& call, Hooks::Params& hp,
//                    tvm::ffi::TensorView t0);
//
// whose body hands the compiled-in scalars and the tensors to the traits' set_params (variant_params.h: element
// type, rank, a CUDA tensor, contiguity) and checks each tensor against the call (check_slot_tensor: q's GPU, the
// declared dims), so that no hook reads past a tensor the call does not fit.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "ffi_glue.h"
#include "variant_params.h"

namespace attngen {
namespace tvm_slot {

// The sizes of one slot call that a tensor parameter's declared dims name (attngen/ir/declarations.py CALL_SIZES),
// and the GPU of its query rows.
struct SlotCall {
  int device_id;
  int64_t batch_size, num_qo_heads, num_kv_heads, head_dim, total_q;
};

enum class CallSize : int { kNone = -1, kBatchSize, kNumQoHeads, kNumKvHeads, kHeadDim, kTotalQ };

// One declared dim of a tensor parameter (TensorParam.shape): exactly `fixed` (>= 0), equal to a call size, at least
// `fixed` or a call size (at_least), or any length (a plain symbol: the hooks' reads along it were bounded by the
// tensor's own size when the cache was created).
struct DeclaredDim {
  const char* text;  // as declared, for the errors
  int64_t fixed;     // -1: none
  CallSize size;
  bool at_least;
};

inline const char* call_size_name(CallSize s) {
  switch (s) {
    case CallSize::kBatchSize: return "batch_size";
    case CallSize::kNumQoHeads: return "num_qo_heads";
    case CallSize::kNumKvHeads: return "num_kv_heads";
    case CallSize::kHeadDim: return "head_dim";
    case CallSize::kTotalQ: return "total_q";
    default: return "";
  }
}

inline int64_t call_size(const SlotCall& call, CallSize s) {
  switch (s) {
    case CallSize::kBatchSize: return call.batch_size;
    case CallSize::kNumQoHeads: return call.num_qo_heads;
    case CallSize::kNumKvHeads: return call.num_kv_heads;
    case CallSize::kHeadDim: return call.head_dim;
    case CallSize::kTotalQ: return call.total_q;
    default: return -1;
  }
}

// A tensor parameter (already through set_params: its element type, rank, CUDA and contiguity) on the call's GPU and
// of its declared dims. TVM calls a slot with the requests of one prefix depth, so a dim sized by batch_size or
// total_q is sized for the cache's largest call and needs to be at least the call's; the head sizes and fixed
// sizes are exact.
inline void check_slot_tensor(const char* entry, const char* name, const tvm::ffi::TensorView& t,
                              const SlotCall& call, std::initializer_list<DeclaredDim> dims) {
  if (t.device().device_id != call.device_id)
    ATTNGEN_THROW(ValueError) << entry << ": tensor parameter '" << name << "' is on cuda:" << t.device().device_id
                              << ", the call's tensors on cuda:" << call.device_id
                              << "; give create_paged_kv_cache the parameter on the cache's GPU";
  int i = 0;
  for (const DeclaredDim& d : dims) {
    const int64_t got = t.size(i);
    const bool per_call = d.size == CallSize::kBatchSize || d.size == CallSize::kTotalQ;
    const int64_t want = d.size != CallSize::kNone ? call_size(call, d.size) : d.fixed;
    const bool at_least = d.at_least || per_call;
    if (want >= 0 && (at_least ? got < want : got != want))
      ATTNGEN_THROW(ValueError) << entry << ": tensor parameter '" << name << "': dim " << i << " (" << d.text
                                << ") is " << got << ", must be " << (at_least ? "at least " : "")
                                << (d.size != CallSize::kNone ? "the call's " : "") << call_size_name(d.size)
                                << (d.size != CallSize::kNone ? " " : "") << want
                                << "; give create_paged_kv_cache a tensor of the declared shape for this cache";
    ++i;
  }
}

}  // namespace tvm_slot
}  // namespace attngen
