"""Long fuzz run of the CPU backend: random recipes from the whole fragment space, random batches, faults.

Each input is one call (tests/fuzz_engine.py: a variant composed from hook fragments, a random ragged /
paged / decode batch, maybe NaN / Inf injected, maybe one argument spoilt); the run counts the inputs
tried, the outcomes (matched the reference, refused by error kind and fault, not applicable), and keeps
every failure with what reproduces it (recipe, seed, fault). Figures go to
benchmarks/results/fuzz_long.json (``--out``). ``--views`` draws the views' calls (tests/fuzz_views.py),
``--fp8`` the plain calls over fp8 caches (tests/fuzz_fp8.py), both together cascades and block-sparse views
over fp8 pools, each against the same view over the values the pool holds.

    PYTHONPATH=. python benchmarks/fuzz_long.py --recipes 40 --cases-per-recipe 150 --seed 1
"""
from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fuzz_engine import FAULTS, KNOWN_GAPS, FuzzFailure, all_recipes, built  # noqa: E402
from tests.fuzz_fp8 import (FP8_FAULTS, FP8_KV_DTYPES, FP8_VIEW_KINDS, built_fp8, make_fp8_case,  # noqa: E402
                            run_fp8_case, run_fp8_view_case, view_recipes)
from tests.fuzz_views import VIEW_FAULTS, VIEW_KINDS, make_case, run_case  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", type=int, default=40, help="random recipes (variants) to build")
    ap.add_argument("--cases-per-recipe", type=int, default=150)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fault-share", type=float, default=0.5, help="share of calls with a spoilt argument")
    ap.add_argument("--views", action="store_true",
                    help="draw the views' case kinds (cascade, block-sparse, append: tests/fuzz_views.py) instead of "
                         "the plain ragged / paged / decode calls")
    ap.add_argument("--fp8", action="store_true",
                    help="the plain calls over fp8 caches (tests/fuzz_fp8.py: e4m3 and e5m2 in turn, per-tensor or "
                         "per-head scales, FP8_FAULTS)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fuzz_long.json"))
    args = ap.parse_args(argv)
    fp8_views = args.views and args.fp8  # views over fp8 pools against the same views over their values

    rng = np.random.default_rng(args.seed)
    space = view_recipes() if fp8_views else list(all_recipes())
    picks = [space[i] for i in rng.choice(len(space), size=min(args.recipes, len(space)), replace=False)]
    outcomes = collections.Counter()
    refusals = collections.Counter()
    injected = collections.Counter()
    gaps = collections.Counter()
    failures = []
    t0 = time.time()
    build_seconds = 0.0
    for n, recipe in enumerate(picks):
        tb = time.time()
        try:
            kv_dtype = FP8_KV_DTYPES[n % 2]
            variant, att = built_fp8(recipe, kv_dtype) if args.fp8 and not fp8_views else built(recipe)
            att8 = built_fp8(recipe, kv_dtype)[1] if fp8_views else None
        except Exception as e:  # a recipe the variant checks refuse is a finding too
            failures.append({"recipe": asdict(recipe), "stage": "build", "error": f"{type(e).__name__}: {e}"})
            continue
        build_seconds += time.time() - tb
        for _ in range(args.cases_per_recipe):
            seed = int(rng.integers(2**32))
            if fp8_views:
                case = make_case(variant, seed, kinds=FP8_VIEW_KINDS)
                spoilt = []
            elif args.views:
                case = make_case(variant, seed, kinds=VIEW_KINDS)
                spoilt = [f for f in VIEW_FAULTS[case.kind] if f != "none"]
            elif args.fp8:
                case = make_fp8_case(variant, seed, kv_dtype)
                spoilt = list(FP8_FAULTS[1:])
            else:
                case = make_case(variant, seed)
                spoilt = list(FAULTS[1:])
            fault = "none" if rng.random() >= args.fault_share or not spoilt else str(rng.choice(spoilt))
            try:
                if fp8_views:
                    result = run_fp8_view_case(variant, att, att8, case, kv_dtype, seed)
                else:
                    run = run_fp8_case if args.fp8 else run_case
                    result = run(variant, att, case, fault, np.random.default_rng(seed + 1))
            except FuzzFailure as e:
                result = "failed"
                failures.append({"recipe": asdict(recipe), "seed": seed, "fault": fault, "error": str(e)[:600]})
            outcomes[result.split(":")[0]] += 1
            if result.startswith("gap"):
                gaps[result.split(":")[1]] += 1
            if result.startswith("refused"):
                refusals[f"{fault} -> {result.split(':')[1]}"] += 1
            if case.injected and fault == "none":
                injected[case.injected.split(" ")[0] + " " + ("q" if "q[" in case.injected else "kv")] += 1
        print(f"[{n + 1}/{len(picks)}] {recipe.name} {dict(outcomes)} failures {len(failures)}", flush=True)
    tried = sum(v for k, v in outcomes.items() if k != "skip")
    report = {
        "command": "benchmarks/fuzz_long.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": platform.platform(),
        "recipes_built": len(picks),
        "inputs_tried": tried,
        "matched_reference": outcomes["ok"],
        "refused": outcomes["refused"],
        "fault_not_applicable": outcomes["skip"],
        "failures": len(failures),
        "known_gaps": {k: {"calls": n, "missing": KNOWN_GAPS[k]} for k, n in gaps.items()},
        "valid_calls_with_nonfinite_inputs": dict(sorted(injected.items())),
        "refusals_by_fault_and_error": dict(sorted(refusals.items())),
        "seconds": round(time.time() - t0, 1),
        "build_seconds": round(build_seconds, 1),
        "failure_examples": failures[:50],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "failure_examples"}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
