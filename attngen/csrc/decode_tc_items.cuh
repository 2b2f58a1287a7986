// The tensor-core decode's work (decode_tc.cuh): each CTA's work items, from the plan's list or the even split, and
// the fused split-KV merge that the CTA writing a request's last partial state runs.
#pragma once
#include "common.cuh"
#include "decode.cuh"
#include "merge.cuh"

namespace attngen {

// Fused split-KV merge: after writing a partial state of request b (the CTA's KV heads: row `slot` of the
// grid's `slots`), the CTA counts its arrival; the one that brings the count to the request's number of partials
// merges them (for the group's query heads) and writes the output, then zeroes the counter for the next launch.
// Every thread calls it; `sm` is the merge region (free here: the next item's tiles load into the stages).
template <class V, class T, int D, int NT>
__device__ void merge_if_last(const DecodeProblem& P, const typename V::Params& hp, const DecodePlanView& plan, int b,
                              int slot, int slots, int qh0, int group, float* sm, int tid) {
  __shared__ int s_merge, s_last;
  __threadfence();  // this thread's partial rows are visible device-wide before the CTA's arrival counts
  if (tid == 0) s_merge = -1;
  __syncthreads();
  for (int i = tid; i < plan.num_merges; i += NT)
    if (plan.merge_tiles[2 * i] == b) s_merge = i;
  __syncthreads();
  const int m = s_merge;
  if (m < 0) return;  // a partial of a request the plan does not merge: none (uniform across the CTA)
  const int first = plan.merge_indptr[m], count = plan.merge_indptr[m + 1] - first;
  int32_t* counter = plan.merge_counters + int64_t(m) * slots + slot;
  if (tid == 0) s_last = atomicAdd(counter, 1) == count - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();  // the other CTAs' partial rows, read around L1 by merge_partial_heads
  // the group's heads at once: every head's partial loads in flight together (merge_partial_heads)
  merge_partial_heads<V, T, D, NT>(P, hp, b, qh0, group, plan.merge_partials + first, count, sm, tid);
  if (tid == 0) *counter = 0;
}

// One work item: request b, keys [start, end). part_row0 < 0: write the final output (after the
// output transform); else the normalised partial state goes to rows part_row0 + head of
// part_o / part_lse for a merge kernel.
struct DecodeTCItem {
  int b, start, end;
  int64_t part_row0;
};

// The CTA's work items: those of the plan (plan mode) or one chunk of the even split (grid mode).
template <class V>
struct DecodeTCItems {
  const DecodeProblem& P;
  const typename V::Params& hp;
  const int32_t* work;  // plan mode: the CTA's first item; nullptr: grid mode
  int count;
  __device__ __forceinline__ DecodeTCItem get(int i) const {
    if (work != nullptr) {
      const int32_t* item = work + 5 * i;  // request, query tile, kv start, kv end, partial slot
      const int b = item[0];
      const KeyRange vis = request_keys<V>(P, b, view_length<V>(P.kv, b), hp);
      return {b, max(item[2], vis.lo), min(item[3], vis.hi), item[4] < 0 ? -1 : int64_t(item[4]) * P.num_qo_heads};
    }
    const int chunk = blockIdx.x, b = blockIdx.z;
    const KeyRange mine = even_chunk(request_keys<V>(P, b, view_length<V>(P.kv, b), hp), chunk, P.num_chunks);
    return {b, mine.lo, mine.hi,
            P.num_chunks > 1 ? (int64_t(b) * P.num_chunks + chunk) * P.num_qo_heads : -1};
  }
};

}  // namespace attngen
