"""The Hopper template's bulk copies of paged K/V tiles (csrc/hopper_tma.cuh paged_box_rows), checked on the host
for every tiling of the template and every page size up to 1024: a box is a power of two of 8 to 256 rows
dividing both page and tile (every tile starts on a box, no box crosses a page), the largest such, issued by at
most the producer's 128 threads; none where no such power of two reaches 8 rows (those pools are gathered). The
boxes of a tile are dealt over the four producer warps (paged_box_index), and a launch with both tilings keeps the
128-key one where the wide one would shrink the boxes (paged_boxes_kept)."""
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
  for (int t = 0; t < 128; ++t) std::printf("index %d %d\\n", t, paged_box_index(t));
  for (int p = 0; p <= {PAGES[-1]}; ++p)
    std::printf("kept %d %d %d\\n", p, int(paged_boxes_kept<128, 128, 176>(p)), int(paged_boxes_kept<64, 128, 192>(p)));
  return 0;
}}
"""


@requires_nvcc
def test_paged_boxes_divide_page_and_tile(tmp_path):
    src = tmp_path / "boxes.cu"
    src.write_text(program())
    exe = tmp_path / "boxes"
    subprocess.run(["nvcc", "-std=c++17", f"-I{CSRC}", "-o", str(exe), str(src)], check=True, capture_output=True)
    lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    rows = [tuple(map(int, line.split())) for line in lines if line[0].isdigit()]
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

    # box i of a tile from lane i / 4 of warp i % 4: every box index once, a warp's lanes issuing a quarter of them
    index = {int(t): int(i) for _, t, i in (line.split() for line in lines if line.startswith("index"))}
    assert sorted(index.values()) == list(range(128))
    for boxes in (4, 16, 22, 32, 128):
        per_warp = [sum(1 for t, i in index.items() if t // 32 == w and i < boxes) for w in range(4)]
        assert max(per_warp) == -(-boxes // 4), (boxes, per_warp)
    # the wide tiling where its boxes are as large as the 128-key tiling's or 64 rows: ragged, pages of 16 (16 rows
    # either way), at head dim 64 pages of 64 and 128 (boxes of 64 under 192-key tiles), but not pages of 64 or 128
    # at head dim 128 (16 rows under 176-key tiles)
    kept = {int(p): (int(a), int(b)) for _, p, a, b in (line.split() for line in lines if line.startswith("kept"))}
    for p, (k128, k64) in kept.items():
        for d, wide, ok in ((128, 176, k128), (64, 192, k64)):
            assert ok == int(p == 0 or got.get((d, wide, p), 0) >= min(got.get((d, 128, p), 0), 64)), (d, p)
    assert kept[0] == (1, 1) and kept[8] == (1, 1) and kept[16] == (1, 1)
    assert kept[64] == (0, 1) and kept[128] == (0, 1) and kept[32][0] == 0
