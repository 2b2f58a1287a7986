// 2^x on the FMA and integer pipes, for the softmax weights a kernel takes off the special-function unit.
//
// A Hopper SM's special-function unit (MUFU) does 16 results per clock against 128 FMAs, and its tensor cores
// finish a head-dim-64 tile's S = Q K^T and O += P V in about the time MUFU needs for the tile's 2^x alone; a
// logits hook with a transcendental (soft-cap's tanh) doubles MUFU's share at any head dim. Computing some of
// the weights here moves that work onto the otherwise idle FMA pipe (HopperTile::poly_exp2_of_16 says how many).
//
// x = n + f with n = rint(x) and f in [-1/2, 1/2]: one FADD of 1.5 * 2^23 + 127 leaves n + 127 in the low
// mantissa bits, whose shift into the exponent field is 2^n (0.0 for n = -127, so 2^-inf = 0 exactly, as the
// templates' empty-row rule needs: x is clamped to -127 first); 2^f is a degree-3 polynomial fitted for minimax
// relative error on [-1/2, 1/2]: at most 7.5e-5 (tests/test_poly_exp2.py measures it), below the half-ulp
// rounding the weights then get as bf16 (2.0e-3) or fp16 (2.4e-4) P. Results below 2^-126 come out as 0 or as
// a subnormal-size value, as ex2.approx.ftz flushes them: weights that small vanish against the row's maximum 1.
// Nine instructions (max, 3 FADD, 3 FFMA, shift, FMUL) on the FMA / ALU pipes in place of one MUFU.EX2.
//
// Host-compilable (tests/test_poly_exp2.py runs it with g++).
#pragma once
#include "float_ops.h"

namespace attngen {

struct PolyExp2 {
  static constexpr float kShift = 12582912.f + 127.f;  // 1.5 * 2^23 + the exponent bias
  static constexpr float kMin = -127.f;
  // 2^f ~ c0 + f (c1 + f (c2 + f c3)) on [-1/2, 1/2] (float32 coefficients of the fit)
  static constexpr float kC0 = 0.9999280571937561f, kC1 = 0.6932609677314758f, kC2 = 0.2426111251115799f,
                         kC3 = 0.0551716685295105f;
  static constexpr double kMaxRelError = 7.5e-5;
};

ATTNGEN_HD float poly_exp2(float x) {
  x = fmax_nan(x, PolyExp2::kMin);  // (NaN kept; a softmax exponent is at most its rescale slack: no upper clamp)
  const float r = x + PolyExp2::kShift;  // round to nearest: n + 127 in r's low bits
  const float f = x - (r - PolyExp2::kShift);
  const float p = fma_rn(fma_rn(fma_rn(PolyExp2::kC3, f, PolyExp2::kC2), f, PolyExp2::kC1), f, PolyExp2::kC0);
  return p * bits_float(float_bits(r) << 23);
}

}  // namespace attngen
