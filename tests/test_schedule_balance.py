"""benchmarks/schedule_balance.py: the persistent Hopper prefill's static dealing (csrc/hopper_prefill.cuh
work_index, rounds in alternating direction) and the tail it leaves on bench_prefill's cases."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_prefill import CASES  # noqa: E402
from schedule_balance import case_tiling, deal, item_costs  # noqa: E402


def test_deal_follows_the_kernels_snake_rounds():
    # 7 items over 3 CTAs: round 0 to CTAs 0 1 2, round 1 to 2 1 0, round 2's item to CTA 0
    load = deal(np.array([1, 10, 100, 1000, 10000, 100000, 1000000]), 3)
    np.testing.assert_array_equal(load, [1 + 100000 + 1000000, 10 + 10000, 100 + 1000])
    np.testing.assert_array_equal(deal(np.array([5, 6]), 132), [5, 6])  # fewer items than SMs: a CTA each


def test_full_attention_leaves_an_idle_last_round_and_causal_cases_do_not():
    by_name = {c.name: c for c in CASES}
    full = by_name["full L8k"]
    cfg = case_tiling(full)
    items = item_costs(full, cfg)
    assert cfg.keys == 176 and len(items) == 2048 and (items == 8192 // 176 + 2).all()  # 47 key tiles + 1 each
    load = deal(items, 132)
    assert abs(load.mean() / load.max() - 15.515 / 16) < 1e-3  # 15.52 rounds: 64 CTAs idle in the sixteenth
    for name in ("causal L4k", "causal L16k"):
        load = deal(item_costs(by_name[name], case_tiling(by_name[name])), 132)
        assert load.mean() / load.max() > 0.99, name
