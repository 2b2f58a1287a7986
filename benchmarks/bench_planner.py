"""Host time of the split-KV planner for B = 1, 64, 256 decode batches (and FlashInfer's plan when present).

    python benchmarks/bench_planner.py --out benchmarks/results --commit <sha>
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import numpy as np


def median_us(fn, reps=200) -> float:
    for _ in range(10):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts) * 1e6)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    from attngen.runtime.planner import PlannerCapacity, SplitKVPlanner

    planner = SplitKVPlanner(PlannerCapacity(max_batch=1024, max_work_items=1 << 20, max_partials=1 << 20,
                                             max_merge_tiles=1 << 16))
    rng = np.random.default_rng(0)
    res = {"host": f"{platform.processor() or platform.machine()} ({platform.node()})",
           "date": datetime.date.today().isoformat(), "commit": args.commit, "cases": []}
    for batch in (1, 64, 256):
        kv = rng.integers(1, 8192, batch).astype(np.int32)
        qo = np.ones(batch, np.int32)
        row = {"batch": batch,
               "attngen_python_call_us": median_us(lambda: planner.plan(qo, kv, num_ctas=132, group=4, tile_rows=16))}
        row["attngen_cxx_us"] = planner.plan(qo, kv, num_ctas=132, group=4, tile_rows=16).host_ns / 1e3
        res["cases"].append(row)
        print(json.dumps(row))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"planner_{res['date']}.json").write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
