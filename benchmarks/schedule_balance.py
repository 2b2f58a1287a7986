"""How evenly the persistent Hopper prefill's static schedule spreads bench_prefill's cases over the SMs (CPU only).

The kernel (csrc/hopper_prefill.cuh) deals its work items round by round over min(items, SMs) CTAs in snake
order, after the plan's order (runtime/work_order.py: longest first by the mask's bounds). This script deals
the same items with the same cost estimate (key tiles + 1 per item) and prints, per case, the rounds, the
busiest CTA's work against the mean (the makespan over the ideal) and their ratio as an efficiency: the
share of the kernel's time that is not a tail of idle CTAs, under the estimate.

    python benchmarks/schedule_balance.py [--sms 132]
"""
from __future__ import annotations

import argparse

import numpy as np

from bench_prefill import CASES, Case

from attngen.runtime.work_order import order_from_costs, pair_costs
from attngen.runtime.work_tail import snake_ctas
from attngen.schedules.template_prefill_hopper import WIDE_HEAD_DIMS, WIDE_LONG_ROWS, HopperConfig


def case_tiling(case: Case) -> HopperConfig:
    """The tiling the runtime picks for a bench_prefill case (vanilla or causal, 16-bit caches)."""
    wide = case.d in WIDE_HEAD_DIMS and (not case.causal or max(case.qo_lens) >= WIDE_LONG_ROWS)
    return HopperConfig(case.d, wide)


def item_costs(case: Case, cfg: HopperConfig) -> np.ndarray:
    """[items] estimated cost of each work item in the order the kernel deals them (empty pairs dropped)."""
    qo = np.asarray(case.qo_lens, dtype=np.int64)
    group = case.hq // case.hkv
    q_tiles = -(-int(qo.max()) * group // cfg.rows)
    costs = pair_costs(qo, qo, group=group, q_tiles=q_tiles, rows=cfg.rows, keys=cfg.keys,
                       lower=0 if case.causal else None, upper=None)
    items = np.repeat(costs.reshape(-1)[order_from_costs(costs)], case.hkv)
    return items[items > 0]


def deal(items: np.ndarray, sms: int) -> np.ndarray:
    """[ctas] each CTA's summed cost under the kernel's snake dealing (rounds alternate direction)."""
    ctas = min(len(items), sms)
    return np.bincount(snake_ctas(len(items), ctas), weights=items, minlength=ctas).astype(np.float64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sms", type=int, default=132, help="SMs of the GPU (132: H100 SXM and H200)")
    args = ap.parse_args()
    print("| case | keys per tile | items | rounds | busiest CTA / mean | efficiency |\n|---|---|---|---|---|---|")
    for case in CASES:
        cfg = case_tiling(case)
        items = item_costs(case, cfg)
        load = deal(items, args.sms)
        ratio = load.max() / load.mean()
        print(f"| {case.name} | {cfg.keys} | {len(items)} | {len(items) / len(load):.2f} | {ratio:.4f} | "
              f"{1 / ratio:.3f} |")


if __name__ == "__main__":
    main()
