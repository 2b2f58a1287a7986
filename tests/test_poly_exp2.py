"""csrc/poly_exp2.h, the FMA-pipe 2^x some softmax weights of the Hopper prefill take: compiled with the host
compiler and measured against float64 over the exponents a softmax feeds it."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from attngen.codegen.host_library import CSRC, host_cxx

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "poly_exp2.h"
int main(int argc, char** argv) {
  float x;
  while (std::fread(&x, 4, 1, stdin) == 1) {
    const float y = attngen::poly_exp2(x);
    std::fwrite(&y, 4, 1, stdout);
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def poly_exp2(tmp_path_factory):
    cxx, _ = host_cxx()  # (the planner's compiler: the package needs one)
    d = tmp_path_factory.mktemp("poly_exp2")
    (d / "driver.cc").write_text(DRIVER)
    exe = d / "driver"
    subprocess.run([cxx, "-O2", "-std=c++17", f"-I{CSRC}", str(d / "driver.cc"), "-o", str(exe)], check=True)

    def run(x: np.ndarray) -> np.ndarray:
        out = subprocess.run([str(exe)], input=x.astype(np.float32).tobytes(), capture_output=True, check=True)
        return np.frombuffer(out.stdout, dtype=np.float32)

    return run


def _max_error_bound() -> float:
    text = (CSRC / "poly_exp2.h").read_text()
    return float(text.split("kMaxRelError = ")[1].split(";")[0])


def test_relative_error_over_the_softmax_range(poly_exp2):
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-126, 8, 400_001, dtype=np.float32),
                        rng.uniform(-126, 8, 200_000).astype(np.float32),
                        np.arange(-126, 9, dtype=np.float32) + np.float32(0.5),  # rounding ties
                        np.float32([0.0, -0.0, 1e-8, -1e-8])])
    y = poly_exp2(x).astype(np.float64)
    ref = np.exp2(x.astype(np.float64))
    rel = np.abs(y / ref - 1)
    assert rel.max() <= _max_error_bound(), (x[rel.argmax()], rel.max())
    assert rel.max() > 1e-6  # a polynomial, not the library's exp2 (the check above can fail)
    assert np.all(y > 0)


def test_minus_infinity_and_underflow_give_zero_nan_stays_nan(poly_exp2):
    y = poly_exp2(np.float32([-np.inf, -1e30, -200.0, -127.6, np.nan]))
    assert y[0] == 0 and y[1] == 0 and y[2] == 0 and y[3] == 0
    assert np.isnan(y[4])
    tiny = poly_exp2(np.float32([-126.9, -126.5, -126.0]))
    assert np.all((tiny >= 0) & (tiny < 2.0 ** -125))  # below float32's normal range: as good as flushed


def test_weights_sum_like_the_exact_softmax(poly_exp2):
    """A softmax row of 8k logits: the normalised weights from the polynomial against float64 ones."""
    rng = np.random.default_rng(1)
    s = rng.normal(0, 3, 8192)
    x = (s - s.max()) * np.log2(np.e)
    w = poly_exp2(x.astype(np.float32)).astype(np.float64)
    ref = np.exp2(x.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(w / w.sum(), ref / ref.sum(), rtol=2 * _max_error_bound(), atol=0)


def test_traits_count_the_logits_hooks_special_function_calls():
    """kScoreSfuCalls (codegen/cuda_variant.py): the special-function calls per score of the logits hook's per-score
    part, capped at SFU_CALLS_MAX, which the Hopper prefill reads to keep such variants' 2^x on MUFU
    (csrc/hopper_tile.cuh hopper_poly_exp2_of_16); decode objects compile with it 0 (lto.record_abi)."""
    from attngen.codegen.cuda_variant import SFU_CALLS_MAX, traits_parts
    from attngen.codegen.hooks_cuda import lower_hooks_cuda
    from attngen.codegen.lto import record_abi
    from attngen.variants import builtin

    def calls(name, math="approx"):
        v = builtin(name)
        return traits_parts(v, lower_hooks_cuda(v, 128, "sm_90a", math=math), 128)[0]["kScoreSfuCalls"]

    assert calls("logits_softcap") == "1" and calls("logits_softcap", "precise") == "1"  # __tanhf / tanhf
    assert calls("vanilla") == calls("causal") == calls("alibi") == "0"  # (ALiBi: FFMAs only)
    assert calls("sigmoid") == str(SFU_CALLS_MAX)  # a division and an exp per score
    abi = "  static constexpr int kScoreSfuCalls = 1;\n"
    assert record_abi("decode", abi) == "  static constexpr int kScoreSfuCalls = 0;\n"
    assert record_abi("prefill", abi) == abi
