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
  const uint32_t lo = 0x400, hi = 0x400 + 227 * 1024;
  long checked = 0, wrong = 0;
  for (uint32_t tk : {64u, 128u, 176u}) {          // key tiles: 64 at D 256, 128, 176 (wide)
    for (uint32_t step : {32u, 64u, 96u, 128u * 64u, 128u * 128u, 128u * 176u, 2u * 128u * 176u, 16u * 128u}) {
      for (uint32_t a = lo; a + step < hi; a += 16) {
        ++checked;
        wrong += desc_advance(desc_k_major(a), step) != desc_k_major(a + step);
        wrong += desc_advance(desc_mn_major(a, tk * 128), step) != desc_mn_major(a + step, tk * 128);
      }
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
    assert checked > 300_000 and wrong == 0
