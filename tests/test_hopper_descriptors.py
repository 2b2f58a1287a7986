"""The Hopper template's shared-memory matrix descriptors (csrc/hopper_sync.cuh), checked on the host: a
descriptor advanced by a byte offset (``desc_advance``, one add of its address field) equals the descriptor
formed from the advanced address, for every 16-byte-aligned address of a CTA's shared memory and every offset
the mainloop's wgmmas step by."""
import subprocess

from attngen.codegen.cuda_library import CSRC

from .conftest import requires_nvcc

PROGRAM = r"""
#include <cstdio>
#include "hopper_sync.cuh"
using namespace attngen;
int main() {
  // the shared window of a CTA on sm_90: 1 KB reserved, then up to 227 KB
  const uint32_t lo = 0x400, hi = 0x400 + 227 * 1024, rq = 128;  // a tile's query rows (two consumers)
  long checked = 0, wrong = 0;
  auto check = [&](uint32_t step, uint32_t block) {  // block: the MN-major operand's column-block stride
    for (uint32_t a = lo; a + step < hi; a += 16) {
      ++checked;
      wrong += desc_advance(desc_k_major(a), step) != desc_k_major(a + step);
      wrong += desc_advance(desc_mn_major(a, block), step) != desc_mn_major(a + step, block);
    }
  };
  // the offsets of hopper_prefill.cuh's issue_s (Q and K, k-major) and issue_pv (V, mn-major)
  for (uint32_t d : {64u, 128u, 256u}) {
    for (uint32_t tk : {64u, 128u, 176u, 192u}) {
      for (uint32_t k = 0; k < d / 16; ++k) {
        const uint32_t koff = (k % 4) * 32;
        check((k / 4) * rq * 128 + koff, tk * 128);
        check((k / 4) * tk * 128 + koff, tk * 128);
      }
      for (uint32_t kk = 0; kk < tk / 16; ++kk) check(kk * 16 * 128, tk * 128);
    }
  }
  std::printf("%ld %ld\n", checked, wrong);
  return 0;
}
"""


@requires_nvcc
def test_advanced_descriptors_equal_descriptors_of_the_advanced_address(tmp_path):
    src = tmp_path / "desc.cu"
    src.write_text(PROGRAM)
    exe = tmp_path / "desc"
    subprocess.run(["nvcc", "-std=c++17", f"-I{CSRC}", "-o", str(exe), str(src)], check=True, capture_output=True)
    checked, wrong = map(int, subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split())
    assert checked > 3_000_000 and wrong == 0
