"""The Hopper trace tools (benchmarks/trace_hopper_items.py, benchmarks/trace_hopper_tail.py) add their stamps at
source anchors of csrc/hopper_prefill.cuh and csrc/hopper_tail.cuh: every anchor is found exactly once in the
current tree, so a kernel change that moves one fails here and not on a GPU lease."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import trace_hopper_items  # noqa: E402
import trace_hopper_tail  # noqa: E402


@pytest.mark.parametrize("tool,marks", [(trace_hopper_items, {"hopper_prefill.cuh": "ag_tr["}),
                                        (trace_hopper_tail, {"hopper_prefill.cuh": "ag_stamp(",
                                                             "hopper_tail.cuh": "ag_stamp("})])
def test_trace_stamps_find_their_anchors(tool, marks, tmp_path):
    tool.instrument(ROOT, tmp_path)
    for name, mark in marks.items():
        traced = (tmp_path / "attngen" / "csrc" / name).read_text()
        assert mark in traced and mark not in (ROOT / "attngen" / "csrc" / name).read_text(), name
    untouched = (tmp_path / "attngen" / "csrc" / "hopper_tile.cuh").read_text()
    assert untouched == (ROOT / "attngen" / "csrc" / "hopper_tile.cuh").read_text()


def test_a_moved_anchor_stops_the_tool(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_hopper_tail, "PATCHES",
                        [*trace_hopper_tail.PATCHES, ("hopper_tail.cuh", "no such line\n", "x")])
    with pytest.raises(SystemExit, match=r"anchor found 0 times in hopper_tail.cuh"):
        trace_hopper_tail.instrument(ROOT, tmp_path)
