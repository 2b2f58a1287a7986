"""The Hopper template's bulk copies of paged K/V tiles (csrc/hopper_tma.cuh paged_box_rows), checked on the host
for every tiling of the template and every page size up to 1024: a box is a power of two of 8 to 256 rows
dividing both page and tile (every tile starts on a box, no box crosses a page), the largest such, issued by at
most the producer's 128 threads; none where no such power of two reaches 8 rows (those pools are gathered)."""
import subprocess

from attngen.codegen.cuda_library import CSRC
from attngen.schedules.template_prefill_hopper import HEAD_DIMS, WIDE_KEYS, HopperConfig

from .conftest import requires_nvcc

PAGES = range(1, 1025)


def tilings() -> list[tuple[int, int]]:
    """(head_dim, keys per tile) of every Hopper tiling."""
    return [(d, HopperConfig(d, wide).keys) for d in HEAD_DIMS for wide in ((False, True) if d in WIDE_KEYS else
                                                                             (False,))]


def program() -> str:
    cases = "\n".join(f"  for (int p = 1; p <= {PAGES[-1]}; ++p) std::printf(\"{d} {k} %d %d\\n\", p, "
                      f"paged_box_rows<{d}, {k}>(p));" for d, k in tilings())
    return f"""#include <cstdio>
#include "hopper_tma.cuh"
using namespace attngen;
int main() {{
{cases}
  return 0;
}}
"""


@requires_nvcc
def test_paged_boxes_divide_page_and_tile(tmp_path):
    src = tmp_path / "boxes.cu"
    src.write_text(program())
    exe = tmp_path / "boxes"
    subprocess.run(["nvcc", "-std=c++17", f"-I{CSRC}", "-o", str(exe), str(src)], check=True, capture_output=True)
    rows = [tuple(map(int, line.split())) for line in
            subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()]
    assert len(rows) == len(tilings()) * len(PAGES)
    got = {(d, k, p): box for d, k, p, box in rows}
    for (d, k, p), box in got.items():
        largest = max(b for b in (1 << i for i in range(11)) if p % b == 0 and k % b == 0)
        fits = 8 <= largest <= 256 and (k // largest) * (d // 64) <= 128
        assert box == (largest if fits else 0), (d, k, p, box)
    # the cases the bulk copies were measured on (paged_gather_2026-12-06_tma_boxes_h100.md)
    assert got[128, 128, 16] == 16 and got[128, 128, 64] == 64 and got[128, 128, 256] == 128
    assert got[128, 176, 64] == 16 and got[128, 176, 16] == 16 and got[64, 192, 128] == 64
    assert got[128, 128, 12] == 0 and got[128, 128, 24] == 8 and got[256, 64, 1024] == 64
