// TVM PagedKVCache's inline RoPE (RopeMode INLINE: the slots' rotary_mode 1) in attngen's mma.sync prefill and
// tensor-core decode templates, for the "tirx" slots (tvm_slots.h).
//
// TVM's rotation (relax/frontend/nn/llm/_kernel_common.py `_rope`, rope_freq_default): element d of a row at
// position p becomes cos(a) x[d] + sin(a) (d < D/2 ? -x[d + D/2] : x[d - D/2]) with
// a = (p * rope_scale) / rope_theta^((2d mod D) / D), in float32, the result stored in the row's element type.
// Positions are TVM's (PositionWindow, tvm_window.cuh): query row r at q_rope_position[r] (decode: request b's
// query at q_rope_position[b]), key j of request b at k_rope_pos_offset[b] + j (j counted in the sliding-window
// view where there is one). Queries rotate once in shared memory after their load, keys once per loaded K tile,
// both before the variant's own query / key transform. The angle's power and sine / cosine are taken in double
// from TVM's float32 angle, so `--use_fast_math` cannot turn them into approximations (angles reach thousands
// of radians).
// The templates compile this in only for the traits TvmRope<V> (tvm_traits.cuh; `if constexpr (tvm_rope<V>())`),
// which the slots instantiate only in libraries built for inline RoPE: every other instance is the plain kernel,
// unchanged.
#pragma once
#include <stdint.h>

#include <type_traits>

#include "mma.cuh"
#include "tvm_traits.cuh"

namespace attngen {

// TVM's run-time RoPE scalars (read by the RoPE instances only).
struct RopeFreq {
  float scale;  // rope_scale
  float theta;  // rope_theta

  // sin and cos of element d's angle at position pos, for rows of D elements.
  template <int D>
  __device__ __forceinline__ void sincos_at(int pos, int d, float* s, float* c) const {
    const float exponent = __fdiv_rn(float((2 * d) % D), float(D));
    const float denom = float(pow(double(theta), double(exponent)));
    const float angle = __fdiv_rn(__fmul_rn(float(pos), scale), denom);
    double sd, cd;
    sincos(double(angle), &sd, &cd);
    *s = float(sd);
    *c = float(cd);
  }
};

// Rotate one row of D elements in shared memory (element i at at(i)) with one warp, at position pos; `scratch`
// holds D floats of this warp.
template <int D, class At>
__device__ __forceinline__ void rope_rotate_row(At at, float* scratch, int pos, const RopeFreq& rope, int lane) {
  using T = std::remove_reference_t<decltype(at(0))>;
  for (int i = lane; i < D; i += 32) scratch[i] = to_float(at(i));
  __syncwarp();
  for (int i = lane; i < D; i += 32) {
    float s, c;
    rope.sincos_at<D>(pos, i, &s, &c);
    const float partner = i < D / 2 ? -scratch[i + D / 2] : scratch[i - D / 2];
    at(i) = from_float<T>(c * scratch[i] + s * partner);
  }
  __syncwarp();
}

// Rotate the rows r < Rows of a tile in shared memory (row r's element i at at(r, i)) that live(r) keeps, row r at
// position pos(r), the CTA's Warps warps a row each in turn; then a barrier publishes the tile. `scratch` holds D
// floats of this warp.
template <int D, int Rows, int Warps, class At, class Live, class Pos>
__device__ __forceinline__ void rope_rotate_tile(At at, Live live, Pos pos, float* scratch, const RopeFreq& rope,
                                                 int warp, int lane) {
  for (int r = warp; r < Rows; r += Warps) {
    if (!live(r)) continue;
    rope_rotate_row<D>([&](int i) -> decltype(at(r, i)) { return at(r, i); }, scratch, pos(r), rope, lane);
  }
  __syncthreads();
}

}  // namespace attngen
