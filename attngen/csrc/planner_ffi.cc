// TVM-FFI export of the split-KV planner (planner.h) and the decode plan packer (decode_plan_pack.h):
// callable from Python and from a TVM runtime.
//
// Options cross the FFI as maps of named values (tvm::ffi::Map<String, Any>), read here by name:
// a missing key, an unknown key or a value of the wrong kind is a TypeError naming the key; a value
// outside what the planner or the declared bounds allow is a ValueError naming the bound.
//   request   group, tile_rows, num_ctas, alpha, beta, fixed_chunk, min_chunk, mask_lower, mask_upper
//             (the two mask bounds: an integer or None)
//   capacity  max_batch, max_work_items, max_partials, max_merge_tiles, max_ctas
//   layout    mode ("compact" or "bounded"), merge_counter_heads, fused_merge (decode_plan_pack.h)
//   outputs   cta_indptr, work, merge_tiles, merge_indptr, merge_partials (int32 host vectors)
//
// Exports:
//   plan_split_kv(request, capacity, qo_len, kv_len, outputs) -> {"work_items", "partials", "merges",
//       "chunk_limit", "host_ns"}: one plan, its arrays written into `outputs`.
//   split_kv_planner(capacity, outputs) -> {"plan": plan(request, qo_len, kv_len), "pack": pack(buf, layout)}
//       plan writes the plan's arrays into `outputs` and keeps the plan; pack writes the kept plan into an
//       int32 host buffer (the layout's one writer, write_decode_plan).
//   plan_layout_ints(capacity, layout) -> entries of a bounded layout's buffer
//   plan_decode_packed(request, capacity, kv_len, buf) -> {"ints", "merges"}: TVM's decode plan slot's two
//       calls (plan_decode, pack_decode_plan) as that slot makes them.
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "decode_plan_pack.h"
#include "ffi_export.h"
#include "host_error.h"
#include "planner.h"

namespace {

using tvm::ffi::Any;
using tvm::ffi::Function;
using tvm::ffi::Map;
using tvm::ffi::String;
using tvm::ffi::Tensor;
using tvm::ffi::TensorView;
using Options = Map<String, Any>;
using Counts = Map<String, int64_t>;

// The named values of one options map; done() refuses keys nobody read.
class NamedOptions {
 public:
  NamedOptions(const char* what, Options map) : what_(what), map_(std::move(map)) {}

  int64_t integer(const char* key) {
    const Any v = get(key);
    if (std::optional<int64_t> x = v.as<int64_t>()) return *x;
    ATTNGEN_THROW(TypeError) << what_ << "['" << key << "']: expected an integer, got " << v.GetTypeKey();
  }
  std::optional<int64_t> optional_integer(const char* key) {
    const Any v = get(key);
    if (v == nullptr) return std::nullopt;
    if (std::optional<int64_t> x = v.as<int64_t>()) return x;
    ATTNGEN_THROW(TypeError) << what_ << "['" << key << "']: expected an integer or None, got " << v.GetTypeKey();
  }
  double real(const char* key) {
    const Any v = get(key);
    if (std::optional<double> x = v.try_cast<double>()) return *x;
    ATTNGEN_THROW(TypeError) << what_ << "['" << key << "']: expected a number, got " << v.GetTypeKey();
  }
  bool flag(const char* key) {
    const Any v = get(key);
    if (std::optional<bool> x = v.as<bool>()) return *x;
    ATTNGEN_THROW(TypeError) << what_ << "['" << key << "']: expected a bool, got " << v.GetTypeKey();
  }
  std::string text(const char* key) {
    const Any v = get(key);
    if (std::optional<String> x = v.as<String>()) return std::string(*x);
    ATTNGEN_THROW(TypeError) << what_ << "['" << key << "']: expected a string, got " << v.GetTypeKey();
  }
  Tensor tensor(const char* key) {
    const Any v = get(key);
    if (std::optional<Tensor> x = v.as<Tensor>()) return *x;
    ATTNGEN_THROW(TypeError) << what_ << "['" << key << "']: expected a tensor, got " << v.GetTypeKey();
  }
  // Every key of the map was read.
  void done() const {
    if (read_.size() == map_.size()) return;
    for (const auto& kv : map_) {
      const std::string key(kv.first);
      if (std::find(read_.begin(), read_.end(), key) == read_.end())
        ATTNGEN_THROW(TypeError) << what_ << ": unknown key '" << key << "'";
    }
  }

 private:
  Any get(const char* key) {
    auto it = map_.find(String(key));
    if (it == map_.end()) ATTNGEN_THROW(TypeError) << what_ << ": missing key '" << key << "'";
    read_.emplace_back(key);
    return (*it).second;
  }
  const char* what_;
  Options map_;
  std::vector<std::string> read_;
};

int as_int(int64_t v, const char* what, const char* key) {
  if (v < INT32_MIN || v > INT32_MAX) ATTNGEN_THROW(ValueError) << what << "['" << key << "']: " << v << " is past int32";
  return int(v);
}

// A mask bound past the int32 range sees the same keys as one at its edge (no position lies beyond it).
std::optional<int32_t> clamp_bound(std::optional<int64_t> v) {
  if (!v) return std::nullopt;
  return int32_t(std::clamp<int64_t>(*v, INT32_MIN, INT32_MAX));
}

// The request's options as a PlanInput without its length vectors.
attngen::PlanInput read_request(Options map) {
  NamedOptions o("request", std::move(map));
  attngen::PlanInput in;
  in.group = as_int(o.integer("group"), "request", "group");
  in.tile_rows = as_int(o.integer("tile_rows"), "request", "tile_rows");
  in.num_ctas = as_int(o.integer("num_ctas"), "request", "num_ctas");
  in.alpha = o.real("alpha");
  in.beta = o.real("beta");
  in.fixed_chunk = o.integer("fixed_chunk");
  in.min_chunk = o.integer("min_chunk");
  in.mask_lower = clamp_bound(o.optional_integer("mask_lower"));
  in.mask_upper = clamp_bound(o.optional_integer("mask_upper"));
  o.done();
  return in;
}

struct Capacity {
  attngen::PlanCapacity plan;
  int64_t max_batch = 0, max_ctas = 0;
};

Capacity read_capacity(Options map) {
  NamedOptions o("capacity", std::move(map));
  Capacity c;
  c.max_batch = o.integer("max_batch");
  c.plan.max_work_items = o.integer("max_work_items");
  c.plan.max_partials = o.integer("max_partials");
  c.plan.max_merge_tiles = o.integer("max_merge_tiles");
  c.max_ctas = o.integer("max_ctas");
  o.done();
  return c;
}

struct Layout {
  bool bounded = false;
  int64_t merge_counter_heads = 0;
  bool fused_merge = false;
};

Layout read_layout(Options map) {
  NamedOptions o("layout", std::move(map));
  Layout l;
  const std::string mode = o.text("mode");
  if (mode != "compact" && mode != "bounded")
    ATTNGEN_THROW(ValueError) << "layout['mode']: expected \"compact\" or \"bounded\", got \"" << mode << "\"";
  l.bounded = mode == "bounded";
  l.merge_counter_heads = o.integer("merge_counter_heads");
  l.fused_merge = o.flag("fused_merge");
  o.done();
  if (l.merge_counter_heads < 0) ATTNGEN_THROW(ValueError) << "layout['merge_counter_heads']: must be >= 0";
  return l;
}

// Where the plan's sections go in a buffer of `layout` (bounded: by the capacity; compact: by the plan).
attngen::DecodePlanLayout place(const Layout& layout, const Capacity& cap, const attngen::Plan& p, int ctas) {
  return layout.bounded ? attngen::bounded_plan_layout(cap.max_ctas, cap.plan, layout.merge_counter_heads)
                        : attngen::compact_plan_layout(p, ctas, layout.merge_counter_heads);
}

bool is_host_int32_vector(TensorView t) {
  return t.ndim() == 1 && t.dtype().code == kDLInt && t.dtype().bits == 32 && t.device().device_type == kDLCPU &&
         t.IsContiguous();
}

int32_t* host_int32(TensorView t, const char* name, int64_t need) {
  if (!is_host_int32_vector(t)) ATTNGEN_THROW(ValueError) << name << ": expected a contiguous 1-D int32 host tensor";
  if (t.size(0) < need)
    ATTNGEN_THROW(ValueError) << name << ": holds " << t.size(0) << " entries, the plan needs " << need;
  return reinterpret_cast<int32_t*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

void copy_out(const std::vector<int32_t>& src, TensorView dst, const char* name) {
  int32_t* out = host_int32(dst, name, int64_t(src.size()));
  if (!src.empty()) std::memcpy(out, src.data(), src.size() * sizeof(int32_t));
}

const int32_t* lengths(TensorView t) {
  return reinterpret_cast<const int32_t*>(static_cast<const char*>(t.data_ptr()) + t.byte_offset());
}

void check_lengths(TensorView qo_len, TensorView kv_len) {
  for (const TensorView* t : {&qo_len, &kv_len}) {
    if (!is_host_int32_vector(*t) || t->size(0) != qo_len.size(0))
      ATTNGEN_THROW(ValueError) << "qo_len, kv_len: expected two [batch_size] int32 host vectors of the same length";
  }
}

attngen::Plan run_planner(const attngen::PlanInput& in, const attngen::PlanCapacity& cap) {
  try {
    return attngen::plan_split_kv(in, cap);
  } catch (const std::exception& e) {
    ATTNGEN_THROW(ValueError) << e.what();
  }
}

// The caller's vectors for the plan's arrays (work items as rows of 5, merge tiles as rows of 2).
struct PlanOutputs {
  Tensor cta_indptr, work, merge_tiles, merge_indptr, merge_partials;
};

PlanOutputs read_outputs(Options map) {
  NamedOptions o("outputs", std::move(map));
  PlanOutputs out;
  out.cta_indptr = o.tensor("cta_indptr");
  out.work = o.tensor("work");
  out.merge_tiles = o.tensor("merge_tiles");
  out.merge_indptr = o.tensor("merge_indptr");
  out.merge_partials = o.tensor("merge_partials");
  o.done();
  return out;
}

// Plans `request` over the lengths into *p and writes its arrays into `out`.
Counts plan_into(const Capacity& cap, Options request, TensorView qo_len, TensorView kv_len, const PlanOutputs& out,
                 attngen::Plan* p) {
  const auto t0 = std::chrono::steady_clock::now();
  check_lengths(qo_len, kv_len);
  attngen::PlanInput in = read_request(std::move(request));
  in.qo_len = lengths(qo_len);
  in.kv_len = lengths(kv_len);
  in.batch = int(qo_len.size(0));
  if (in.batch > cap.max_batch)
    ATTNGEN_THROW(ValueError) << "max_batch: the batch has " << in.batch << " requests, the planner was sized for "
                              << cap.max_batch;
  if (in.num_ctas <= 0 || in.num_ctas > cap.max_ctas)
    ATTNGEN_THROW(ValueError) << "num_ctas: " << in.num_ctas << " is outside 1..max_ctas=" << cap.max_ctas;
  *p = attngen::Plan();
  *p = run_planner(in, cap.plan);
  std::vector<int32_t> w;
  w.reserve(p->work_request.size() * attngen::kWorkItemInts);
  for (size_t i = 0; i < p->work_request.size(); ++i)
    w.insert(w.end(),
             {p->work_request[i], p->work_qtile[i], p->work_kv_start[i], p->work_kv_end[i], p->work_partial[i]});
  std::vector<int32_t> m;
  m.reserve(p->merge_request.size() * attngen::kMergeTileInts);
  for (size_t i = 0; i < p->merge_request.size(); ++i) m.insert(m.end(), {p->merge_request[i], p->merge_qtile[i]});
  copy_out(p->cta_indptr, out.cta_indptr, "cta_indptr");
  copy_out(w, out.work, "work");
  copy_out(m, out.merge_tiles, "merge_tiles");
  copy_out(p->merge_indptr, out.merge_indptr, "merge_indptr");
  copy_out(p->merge_partials, out.merge_partials, "merge_partials");
  const int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  return Counts({{"work_items", int64_t(p->work_request.size())},
                 {"partials", int64_t(p->merge_partials.size())},
                 {"merges", int64_t(p->merge_request.size())},
                 {"chunk_limit", p->chunk_limit},
                 {"host_ns", ns}});
}

// One plan, its arrays written into `outputs`; returns its counts (work_items, partials, merges,
// chunk_limit, host_ns).
Counts plan_split_kv(Options request, Options capacity, TensorView qo_len, TensorView kv_len, Options outputs) {
  attngen::Plan p;
  return plan_into(read_capacity(std::move(capacity)), std::move(request), qo_len, kv_len,
                   read_outputs(std::move(outputs)), &p);
}

// A planner of declared capacity with its output vectors bound once; it keeps its latest plan for pack.
struct PlannerState {
  Capacity cap;
  PlanOutputs outputs;
  std::mutex lock;
  attngen::Plan latest;  // no CTAs (empty cta_indptr): nothing to pack
};

Counts pack(PlannerState& s, TensorView buf, Options layout_options) {
  const Layout layout = read_layout(std::move(layout_options));
  std::lock_guard<std::mutex> guard(s.lock);
  if (s.latest.cta_indptr.empty()) ATTNGEN_THROW(ValueError) << "pack: no plan to pack (plan first)";
  const int ctas = int(s.latest.cta_indptr.size()) - 1;
  const attngen::DecodePlanLayout l = place(layout, s.cap, s.latest, ctas);
  int32_t* out = host_int32(buf, "buf", l.ints);
  try {
    attngen::write_decode_plan(s.latest, ctas, l, layout.fused_merge, out);
  } catch (const std::exception& e) {
    ATTNGEN_THROW(ValueError) << e.what();
  }
  return Counts({{"ints", l.ints}, {"merges", int64_t(s.latest.merge_request.size())}});
}

tvm::ffi::Map<String, Function> split_kv_planner(Options capacity, Options outputs) {
  auto s = std::make_shared<PlannerState>();
  s->cap = read_capacity(std::move(capacity));
  s->outputs = read_outputs(std::move(outputs));
  Function plan_fn = Function::FromTyped([s](Options request, TensorView qo_len, TensorView kv_len) {
    std::lock_guard<std::mutex> guard(s->lock);
    return plan_into(s->cap, std::move(request), qo_len, kv_len, s->outputs, &s->latest);
  });
  Function pack_fn = Function::FromTyped([s](TensorView buf, Options layout) { return pack(*s, buf, std::move(layout)); });
  return tvm::ffi::Map<String, Function>({{"plan", plan_fn}, {"pack", pack_fn}});
}

int64_t plan_layout_ints(Options capacity, Options layout_options) {
  const Capacity cap = read_capacity(std::move(capacity));
  const Layout layout = read_layout(std::move(layout_options));
  if (!layout.bounded) ATTNGEN_THROW(ValueError) << "layout['mode']: a compact layout's size depends on the plan";
  return attngen::bounded_plan_layout(cap.max_ctas, cap.plan, layout.merge_counter_heads).ints;
}

Counts plan_decode_packed(Options request, Options capacity, TensorView kv_len, TensorView buf) {
  const attngen::PlanInput in = read_request(std::move(request));
  const Capacity cap = read_capacity(std::move(capacity));
  check_lengths(kv_len, kv_len);
  if (in.tile_rows != 16 || in.mask_lower || in.mask_upper)
    ATTNGEN_THROW(ValueError) << "plan_decode_packed: a decode plan has 16-row tiles and no mask bounds";
  attngen::Plan p;
  try {
    p = attngen::plan_decode(lengths(kv_len), int(kv_len.size(0)), in.group, in.num_ctas, in.alpha, in.beta,
                             in.fixed_chunk, in.min_chunk, cap.plan);
  } catch (const std::exception& e) {
    ATTNGEN_THROW(ValueError) << e.what();
  }
  const int64_t need = attngen::pack_decode_plan(p, in.num_ctas, nullptr);
  attngen::pack_decode_plan(p, in.num_ctas, host_int32(buf, "buf", need));
  return Counts({{"ints", need}, {"merges", int64_t(p.merge_request.size())}});
}

// The decode plans' shortest chunk over kv_len [B] (the rule TVM's decode plan slot applies in C++)
int64_t decode_chunk_floor(TensorView kv_len, int64_t ctas, int64_t floor, int64_t tiny) {
  check_lengths(kv_len, kv_len);
  return attngen::decode_chunk_floor(lengths(kv_len), int(kv_len.size(0)), int(ctas), floor, tiny);
}

}  // namespace

ATTNGEN_EXPORT_TYPED_FUNC(plan_split_kv, plan_split_kv);
ATTNGEN_EXPORT_TYPED_FUNC(decode_chunk_floor, decode_chunk_floor);
ATTNGEN_EXPORT_TYPED_FUNC(split_kv_planner, split_kv_planner);
ATTNGEN_EXPORT_TYPED_FUNC(plan_layout_ints, plan_layout_ints);
ATTNGEN_EXPORT_TYPED_FUNC(plan_decode_packed, plan_decode_packed);
