// A row hook (query / key / output transform) applied by one warp to one fp32 row in
// shared memory: elementwise forms lane-parallel, whole-row forms by lane 0.
#pragma once

namespace attngen {

// Apply row hook `op(in_row, out_row)` to one row with a warp: elementwise forms per lane.
template <int D, bool Elementwise, class Elem, class Row>
__device__ __forceinline__ void warp_row_hook(float* scratch, float* out, Elem elem, Row row, int lane) {
  if constexpr (Elementwise) {
    for (int i = lane; i < D; i += 32) out[i] = elem(scratch, i);
  } else if (lane == 0) {
    row(scratch, out);
  }
  __syncwarp();
}

}  // namespace attngen
