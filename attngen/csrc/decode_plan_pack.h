// Host side of the decode work list: pack a planner result (planner.h) into the int32 buffer the
// tensor-core decode template reads through DecodePlanView (decode.cuh). Same layout as
// attngen/runtime/decode_plan.py: [0] merges, [1] CTAs, [2..6] offsets of cta_indptr [C+1],
// work items [W, 5], merge tiles [M, 2], merge_indptr [M+1], merge_partials [P].
#pragma once
#include <cstdint>
#include <vector>

#include "planner.h"

namespace attngen {

constexpr int kPlanHeader = 8;

// Plans one decode step: one query row per request (a 16-row tile of the group's heads), kv_len[b] keys.
inline Plan plan_decode(const int32_t* kv_len, int batch, int group, int ctas, double alpha, double beta,
                        int64_t fixed_chunk, int64_t min_chunk, const PlanCapacity& cap) {
  std::vector<int32_t> qo_len(size_t(batch), 1);
  PlanInput in{qo_len.data(), kv_len, batch, group, 16, ctas, alpha, beta, fixed_chunk, false, false, 0, 0, min_chunk};
  return plan_split_kv(in, cap);
}

// Writes the plan into `buf` (at least packed_plan_ints(plan, ctas) entries); returns that size.
inline int64_t pack_decode_plan(const Plan& p, int ctas, int32_t* buf) {
  const int64_t n_work = int64_t(p.work_request.size()), n_merge = int64_t(p.merge_request.size());
  int64_t at = kPlanHeader;
  const int64_t off_cta = at; at += ctas + 1;
  const int64_t off_work = at; at += 5 * n_work;
  const int64_t off_tiles = at; at += 2 * n_merge;
  const int64_t off_mptr = at; at += n_merge + 1;
  const int64_t off_parts = at; at += int64_t(p.merge_partials.size());
  if (buf == nullptr) return at;
  buf[0] = int32_t(n_merge);
  buf[1] = ctas;
  buf[2] = int32_t(off_cta);
  buf[3] = int32_t(off_work);
  buf[4] = int32_t(off_tiles);
  buf[5] = int32_t(off_mptr);
  buf[6] = int32_t(off_parts);
  buf[7] = 0;
  for (int c = 0; c <= ctas; ++c) buf[off_cta + c] = p.cta_indptr[c];
  for (int64_t w = 0; w < n_work; ++w) {
    int32_t* item = buf + off_work + 5 * w;
    item[0] = p.work_request[w];
    item[1] = p.work_qtile[w];
    item[2] = p.work_kv_start[w];
    item[3] = p.work_kv_end[w];
    item[4] = p.work_partial[w];
  }
  for (int64_t m = 0; m < n_merge; ++m) {
    buf[off_tiles + 2 * m] = p.merge_request[m];
    buf[off_tiles + 2 * m + 1] = p.merge_qtile[m];
  }
  for (int64_t m = 0; m <= n_merge; ++m) buf[off_mptr + m] = p.merge_indptr[m];
  for (size_t i = 0; i < p.merge_partials.size(); ++i) buf[off_parts + i] = p.merge_partials[i];
  return at;
}

}  // namespace attngen
