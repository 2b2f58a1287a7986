"""benchmarks/row_run_probe.py: its orders copy every row of the pool once, in runs of the lengths its docstring
gives (whole pages; a token's KV heads; single rows at a stride of the KV heads)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

torch = pytest.importorskip("torch")

from row_run_probe import HKV, PAGE, orders  # noqa: E402


def runs(idx):
    """Lengths of the maximal stretches of consecutive row ids in ``idx``."""
    breaks = torch.nonzero(idx[1:] - idx[:-1] != 1).flatten() + 1
    edges = torch.cat([torch.tensor([0]), breaks, torch.tensor([idx.numel()])])
    return (edges[1:] - edges[:-1]).tolist()


def test_every_order_is_a_permutation_with_its_run_lengths():
    pages = 37
    found = orders(pages, torch.Generator().manual_seed(3))
    rows = pages * PAGE * HKV
    for name, idx in found.items():
        assert idx.dtype == torch.int32 and torch.equal(idx.long().sort().values, torch.arange(rows)), name
    assert runs(found["pool"].long()) == [rows]
    # random page / token orders may put neighbours next to each other by chance: runs are multiples, and
    # most are exactly one unit
    for name, unit in (("page-major", PAGE * HKV), ("token-major", HKV)):
        lengths = runs(found[name].long())
        assert all(n % unit == 0 for n in lengths) and lengths.count(unit) > len(lengths) // 2, name
    head = found["head-major"].long()
    assert head.numel() == rows and bool(((head[1:] - head[:-1]) != 1).all())  # no two rows adjacent
    assert bool((head[:rows // HKV] % HKV == 0).all())  # KV head 0 first
