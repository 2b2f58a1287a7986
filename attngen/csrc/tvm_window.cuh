// TVM PagedKVCache's sliding windows in attngen's templates, for the "tirx" sliding-window slots (tvm_slots.h).
//
// Two things, read from TVM's arrays at run time (the layer window itself is the build's, PositionWindow::window):
// - the view of a request's keys through length_info [3, B] (last page length, window offset, sink size):
//   its first `sink` keys are its first rows, the others lie from row `window offset` on
//   (KVRows::sink / window_offset, kv_rows.cuh). Per-sequence windows with attention sinks (StreamingLLM)
//   drop the rows in between; "mha_sliding" layers see their last pages from an offset, without sinks.
// - the window of "mha_sliding" layers, a mask by TVM's token positions (PositionWindow): the query of
//   position p sees key j of request b only if p - (k_rope_pos_offset[b] + j) < window, and, under TVM's
//   prefill causal flag, only if that key's position is not past p. (TVM's page trimming alone leaves keys
//   beyond the window where a shared prefix or a step's history is attended.) Prefill tests each score at
//   its row's position (score_rules.cuh; every tile is checked where rows see different keys); decode, one
//   query per request, narrows the request's key range instead (decode.cuh, request_keys).
// The templates compile either in only for the traits TvmWindowed<V> (tvm_traits.cuh;
// `if constexpr (tvm_windowed<V>())`): every other instance is the plain kernel, unchanged.
#pragma once
#include <stdint.h>

#include "kv_rows.cuh"
#include "tvm_traits.cuh"

namespace attngen {

// Keys of request b: through TVM's sliding-window view in windowed instances, else the plain count.
template <class V>
__device__ __forceinline__ int view_length(const KVRows& kv, int b) {
  if constexpr (tvm_windowed<V>()) return kv.window_length(b);
  else return kv.length(b);
}

// TVM's positions and the window of a windowed call: query row r of the call sits at q_pos[r] (decode: request
// b's query at q_pos[b]), key j of request b at k_pos0[b] + j.
struct PositionWindow {
  const int32_t* q_pos;   // TVM's q_rope_position
  const int32_t* k_pos0;  // TVM's k_rope_pos_offset
  int window;  // > 0: a key is visible only when q - k < window ("mha_sliding" layers); 0: no window
  int causal;  // 1: a key is visible only when k <= q (TVM's prefill causal flag, at these positions)

  // Whether rows of one request may see different keys (else every row sees every key of the view).
  __host__ __device__ bool limits_rows() const { return window > 0 || causal != 0; }

  // Whether a key `dist` positions before the query (q - k) is visible.
  __device__ __forceinline__ bool sees(int dist) const {
    return (window <= 0 || dist < window) && (!causal || dist >= 0);
  }

  // Keys [lo, hi) of request b that a query at position q may see (not clipped to the view).
  __device__ __forceinline__ void key_bounds(int b, int q, int& lo, int& hi) const {
    const long long rel = (long long)q - k_pos0[b];  // the key index at the query's own position
    const long long l = window > 0 ? rel - window + 1 : (long long)INT32_MIN;
    const long long h = causal ? rel + 1 : (long long)INT32_MAX;
    lo = int(l < INT32_MIN ? INT32_MIN : (l > INT32_MAX ? INT32_MAX : l));
    hi = int(h < INT32_MIN ? INT32_MIN : (h > INT32_MAX ? INT32_MAX : h));
  }
};

// The row of key j in the view: past the sinks, shifted to the window (windowed instances), else j.
template <class V>
__device__ __forceinline__ int view_row(const SinkShift& sinks, int j) {
  if constexpr (tvm_windowed<V>()) return sinks.row(j);
  else return j;
}

// Per query row of a windowed instance's score rules (score_rules.cuh): rows g and g + 8 of a fragment sit
// rel_pos positions after their request's first key, so key j lies rel_pos - j positions before the row
// (TVM's positions, int32 like TVM's arrays); plain instances carry nothing.
template <bool Windowed>
struct RowPositions {};
template <>
struct RowPositions<true> {
  int rel_pos[2];
};

// The relative positions of rows prow and prow + 8 (packed rows token * group + head) of request b, whose first
// query row in the call is q0 (rows past the request's are never visible: theirs is unused).
__device__ __forceinline__ void set_row_positions(RowPositions<true>& rb, const PositionWindow& win, int b, int q0,
                                                  int prow, int group, int rows_total) {
  rb.rel_pos[0] = rb.rel_pos[1] = 0;
  if (!win.limits_rows()) return;  // (then every row sees every key: no position is read)
  const int k0 = win.k_pos0[b];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int pr = prow + 8 * h;
    if (pr < rows_total) rb.rel_pos[h] = win.q_pos[q0 + pr / group] - k0;
  }
}

}  // namespace attngen
