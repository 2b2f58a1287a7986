"""GPU: the hooks' hardware approximations (codegen/hook_math.py) against float64, and a soft-capped
prefill in both math modes against the float64 reference of the whole attention."""
import math
import subprocess

import numpy as np
import pytest

from attngen.variants import builtin

from .test_gpu_prefill import run_prefill

pytestmark = pytest.mark.gpu

N = 1 << 17
PROBE = r"""
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>
__global__ void eval(const float* x, const float* y, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[4 * i + 0] = __tanhf(x[i]);
  out[4 * i + 1] = __logf(fabsf(x[i]));
  out[4 * i + 2] = __fdividef(x[i], y[i]);
  out[4 * i + 3] = __expf(x[i]);
}
int main() {
  const int n = %(n)d;
  std::vector<float> x(n), y(n), out(4 * size_t(n));
  for (int i = 0; i < n; ++i) {  // x over [-12, 12), y over +-[2^-20, 2^20)
    x[i] = -12.0f + 24.0f * (float(i) + 0.5f) / float(n);
    float e = -20.0f + 40.0f * float((i * 7919) %% n) / float(n);
    y[i] = ((i & 1) ? -1.0f : 1.0f) * ldexpf(1.0f + float(i %% 1021) / 1021.0f, int(e));
  }
  float *dx, *dy, *dout;
  cudaMalloc(&dx, n * 4); cudaMalloc(&dy, n * 4); cudaMalloc(&dout, 16 * size_t(n));
  cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dy, y.data(), n * 4, cudaMemcpyHostToDevice);
  eval<<<(n + 255) / 256, 256>>>(dx, dy, dout, n);
  if (cudaMemcpy(out.data(), dout, 16 * size_t(n), cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
  for (int i = 0; i < n; ++i)
    printf("%%.9e %%.9e %%.9e %%.9e %%.9e %%.9e\n", x[i], y[i], out[4 * i], out[4 * i + 1], out[4 * i + 2],
           out[4 * i + 3]);
  return 0;
}
"""


def test_approximations_meet_their_documented_error(tmp_path):
    src = tmp_path / "probe.cu"
    src.write_text(PROBE % {"n": N})
    exe = tmp_path / "probe"
    subprocess.run(["nvcc", "-O2", "-o", str(exe), str(src)], check=True, capture_output=True)
    rows = np.loadtxt(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines())
    x, y = rows[:, 0], rows[:, 1]
    tanh_ref = np.tanh(x)
    tanh_rel = np.abs(rows[:, 2] - tanh_ref) / np.maximum(np.abs(tanh_ref), 2.0 ** -20)
    log_ref = np.log(np.abs(x))
    log_abs = np.abs(rows[:, 3] - log_ref)
    log_ulps = log_abs / np.spacing(np.abs(log_ref).astype(np.float32)).astype(np.float64)
    in_core = (np.abs(x) >= 0.5) & (np.abs(x) <= 2)
    div_ref = x / y
    div_ulps = np.abs(rows[:, 4] - div_ref) / np.spacing(np.abs(div_ref).astype(np.float32)).astype(np.float64)
    exp_ref = np.exp(x)
    exp_ulps = np.abs(rows[:, 5] - exp_ref) / np.spacing(exp_ref.astype(np.float32)).astype(np.float64)
    print(f"__tanhf max rel 2^{math.log2(tanh_rel.max()):.2f}; __logf max abs 2^{math.log2(log_abs[in_core].max()):.2f} "
          f"in [0.5, 2], max {log_ulps[~in_core].max():.2f} ulp outside; "
          f"__fdividef max {div_ulps.max():.2f} ulp; __expf max {exp_ulps.max():.2f} ulp (x in [-12, 12))")
    # the documented bounds (hook_math.APPROX_MAX_ERROR), with half a unit for the float32 rounding of the result
    assert tanh_rel.max() <= 2.0 ** -10.5
    assert log_abs[in_core].max() <= 2.0 ** -21.41 * 1.5 and log_ulps[~in_core].max() <= 3.5
    assert div_ulps.max() <= 2.5
    assert np.all(exp_ulps <= 2.5 + np.floor(np.abs(1.173 * x)))


@pytest.mark.parametrize("math_mode", ["approx", "precise"])
def test_softcap_prefill_matches_the_reference_in_both_modes(math_mode, build_cache, rng):
    from attngen.runtime import CUDAAttention

    v = builtin("logits_softcap")
    # (both layouts, as the prefill tests' soft-cap library: the approximate build is theirs, from the cache)
    att = CUDAAttention.build(v, head_dims=(128,), dtypes=("bfloat16",), kernels=("prefill",), hook_math=math_mode,
                              cache=build_cache)
    for kv_mode in ("ragged", "NHD"):
        run_prefill(att, v, rng, group=4, head_dim=128, dtype="bfloat16", kv_mode=kv_mode,
                    qo_lens=(300, 1, 0, 77), kv_lens=(300, 513, 9, 200))
