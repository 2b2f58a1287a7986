// The packed decode plan: the one int32 buffer the tensor-core decode template reads its work list from
// (DecodePlanView in decode.cuh), and the one writer of it. Every producer packs through
// write_decode_plan: the Python runtime's decode workspace (planner_ffi.cc) and TVM's decode plan slot
// (cuda_tvm_slots.py, through pack_decode_plan).
//
// Layout (int32 entries):
//   header, kPlanHeaderInts words:
//     [0] merges M   [1] CTAs C   [2..6] offsets of the five sections below, in this order
//     [7] offset of the fused merge's arrival counters (0: no fused merge)
//   sections, one after the other from the end of the header:
//     cta_indptr      [C+1]    work items of CTA c are work[cta_indptr[c] : cta_indptr[c+1]]
//     work            [W, 5]   request, query tile, kv start, kv end, partial slot (-1: writes its output)
//     merge_tiles     [M, 2]   request, query tile of each split tile
//     merge_indptr    [M+1]    partial slots of split tile m are merge_partials[merge_indptr[m] : ...[m+1]]
//     merge_partials  [P]      partial slots in KV order
//   then, when the buffer has them, the fused merge's counters [max merges, KV heads] (zero between
//   launches: the merging CTA resets its own, and they stay zero in the host copy).
//
// Two ways to place the sections (DecodePlanLayout):
//   compact  each section exactly as long as this plan's (TVM's slot: one plan, one copy);
//   bounded  each section as long as the declared bounds allow, so every offset is fixed by the
//            bounds alone: a CUDA graph captured with one plan reads any later plan of the same bounds.
// Entries past a section's used length are left as they were (the reader never looks at them).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "planner.h"

namespace attngen {

// Header words (see the layout above).
enum PlanHeaderWord : int {
  kPlanWordMerges = 0,
  kPlanWordCtas = 1,
  kPlanWordCtaIndptr = 2,
  kPlanWordWork = 3,
  kPlanWordMergeTiles = 4,
  kPlanWordMergeIndptr = 5,
  kPlanWordMergePartials = 6,
  kPlanWordMergeCounters = 7,
};
constexpr int kPlanHeaderInts = 8;
constexpr int kWorkItemInts = 5;
constexpr int kMergeTileInts = 2;

// How many entries each section holds room for; merge_counter_heads > 0 adds the fused merge's
// counters (merges x that many KV heads) after the sections.
struct PlanSectionSizes {
  int64_t ctas = 0, work_items = 0, merges = 0, partials = 0;
  int64_t merge_counter_heads = 0;
};

// Where each section starts; `ints` is the whole buffer (counters included).
struct DecodePlanLayout {
  int64_t cta_indptr = 0, work = 0, merge_tiles = 0, merge_indptr = 0, merge_partials = 0;
  int64_t merge_counters = 0;  // 0: the buffer has no counters
  int64_t ints = 0;
};

inline DecodePlanLayout plan_layout(const PlanSectionSizes& s) {
  DecodePlanLayout l;
  int64_t at = kPlanHeaderInts;
  l.cta_indptr = at;
  at += s.ctas + 1;
  l.work = at;
  at += kWorkItemInts * s.work_items;
  l.merge_tiles = at;
  at += kMergeTileInts * s.merges;
  l.merge_indptr = at;
  at += s.merges + 1;
  l.merge_partials = at;
  at += s.partials;
  if (s.merge_counter_heads > 0) {
    l.merge_counters = at;
    at += s.merges * s.merge_counter_heads;
  }
  l.ints = at;
  return l;
}

// Sections exactly as long as this plan's.
inline DecodePlanLayout compact_plan_layout(const Plan& p, int ctas, int64_t merge_counter_heads = 0) {
  PlanSectionSizes s;
  s.ctas = ctas;
  s.work_items = int64_t(p.work_request.size());
  s.merges = int64_t(p.merge_request.size());
  s.partials = int64_t(p.merge_partials.size());
  s.merge_counter_heads = merge_counter_heads;
  return plan_layout(s);
}

// Sections as long as the declared bounds allow (offsets fixed by the bounds).
inline DecodePlanLayout bounded_plan_layout(int64_t max_ctas, const PlanCapacity& cap, int64_t merge_counter_heads) {
  PlanSectionSizes s;
  s.ctas = max_ctas;
  s.work_items = cap.max_work_items;
  s.merges = cap.max_merge_tiles;
  s.partials = cap.max_partials;
  s.merge_counter_heads = merge_counter_heads;
  return plan_layout(s);
}

// Writes plan `p` (of `ctas` CTAs) into `buf` (at least l.ints entries) as `l` places it. fused_merge
// points header word 7 at the counters (the layout must have them). Throws std::length_error when the
// plan does not fit the layout's sections.
inline void write_decode_plan(const Plan& p, int ctas, const DecodePlanLayout& l, bool fused_merge, int32_t* buf) {
  const int64_t n_work = int64_t(p.work_request.size()), n_merge = int64_t(p.merge_request.size());
  const int64_t n_parts = int64_t(p.merge_partials.size());
  const int64_t room[] = {l.work - l.cta_indptr, l.merge_tiles - l.work, l.merge_indptr - l.merge_tiles,
                          l.merge_partials - l.merge_indptr,
                          (l.merge_counters > 0 ? l.merge_counters : l.ints) - l.merge_partials};
  const int64_t need[] = {ctas + 1, kWorkItemInts * n_work, kMergeTileInts * n_merge, n_merge + 1, n_parts};
  const char* names[] = {"cta_indptr", "work", "merge_tiles", "merge_indptr", "merge_partials"};
  for (int i = 0; i < 5; ++i) {
    if (need[i] > room[i])
      throw std::length_error(std::string(names[i]) + ": the plan needs " + std::to_string(need[i]) +
                              " entries, the layout holds " + std::to_string(room[i]));
  }
  if (l.ints > INT32_MAX)
    throw std::length_error("the packed plan needs " + std::to_string(l.ints) + " entries, past int32 offsets");
  if (fused_merge && l.merge_counters == 0)
    throw std::invalid_argument("fused_merge: the layout has no merge counters (sized for no KV heads)");
  buf[kPlanWordMerges] = int32_t(n_merge);
  buf[kPlanWordCtas] = ctas;
  buf[kPlanWordCtaIndptr] = int32_t(l.cta_indptr);
  buf[kPlanWordWork] = int32_t(l.work);
  buf[kPlanWordMergeTiles] = int32_t(l.merge_tiles);
  buf[kPlanWordMergeIndptr] = int32_t(l.merge_indptr);
  buf[kPlanWordMergePartials] = int32_t(l.merge_partials);
  buf[kPlanWordMergeCounters] = fused_merge ? int32_t(l.merge_counters) : 0;
  for (int c = 0; c <= ctas; ++c) buf[l.cta_indptr + c] = p.cta_indptr[c];
  for (int64_t w = 0; w < n_work; ++w) {
    int32_t* item = buf + l.work + kWorkItemInts * w;
    item[0] = p.work_request[w];
    item[1] = p.work_qtile[w];
    item[2] = p.work_kv_start[w];
    item[3] = p.work_kv_end[w];
    item[4] = p.work_partial[w];
  }
  for (int64_t m = 0; m < n_merge; ++m) {
    buf[l.merge_tiles + kMergeTileInts * m] = p.merge_request[m];
    buf[l.merge_tiles + kMergeTileInts * m + 1] = p.merge_qtile[m];
  }
  for (int64_t m = 0; m <= n_merge; ++m) buf[l.merge_indptr + m] = p.merge_indptr[m];
  for (int64_t i = 0; i < n_parts; ++i) buf[l.merge_partials + i] = p.merge_partials[i];
}

// The shortest chunk of a decode plan over kv_len[batch] with `ctas` plan columns (CTAs per KV head), as
// schedules/cost_model.py decode_min_chunk rules: the head dim's `floor`, or `tiny` where the batch's chunks at
// `floor` would number at most an eighth of the columns (one request of 512 keys at D 128 on the H200).
inline int64_t decode_chunk_floor(const int32_t* kv_len, int batch, int ctas, int64_t floor, int64_t tiny) {
  if (floor <= tiny || batch <= 0 || 8 * int64_t(batch) > ctas) return floor;
  int64_t chunks = 0;
  for (int b = 0; b < batch; ++b) chunks += std::max<int64_t>(1, (int64_t(kv_len[b]) + floor - 1) / floor);
  return 8 * chunks <= ctas ? tiny : floor;
}

// Plans one decode step: one query row per request (a 16-row tile of the group's heads), kv_len[b] keys.
inline Plan plan_decode(const int32_t* kv_len, int batch, int group, int ctas, double alpha, double beta,
                        int64_t fixed_chunk, int64_t min_chunk, const PlanCapacity& cap) {
  std::vector<int32_t> qo_len(size_t(batch), 1);
  PlanInput in;
  in.qo_len = qo_len.data();
  in.kv_len = kv_len;
  in.batch = batch;
  in.group = group;
  in.tile_rows = 16;
  in.num_ctas = ctas;
  in.alpha = alpha;
  in.beta = beta;
  in.fixed_chunk = fixed_chunk;
  in.min_chunk = min_chunk;
  return plan_split_kv(in, cap);
}

// The compact packing of `p` into `buf`; returns its size in entries (buf == nullptr: only the size).
inline int64_t pack_decode_plan(const Plan& p, int ctas, int32_t* buf) {
  const DecodePlanLayout l = compact_plan_layout(p, ctas);
  if (buf != nullptr) write_decode_plan(p, ctas, l, false, buf);
  return l.ints;
}

}  // namespace attngen
