"""Fit the decode template's coefficients of the split-KV planner's cost model on this GPU.

The planner (attngen/csrc/planner.h) balances work items over CTAs by
``cost = alpha * rows + beta * kv`` (rows: query rows of the item, the group size in decode;
kv: its keys); attngen/schedules/cost_model.py holds provisional values. Method:

1. Batches whose load-balanced plan gives every CTA exactly ``m`` work items of exactly ``L``
   keys: ``B = m * C`` requests of length ``L`` (C: the plan's CTAs per KV head). The chunk
   limit is ``max(256, B * L / C) = m * L >= L``, so no request is split (no partials, no
   merge), and equal costs deal the items round-robin: ``m`` per CTA. Every plan is checked
   (items per CTA, keys per item, no merges); a plan that differs is recorded and left out.
2. Each launch is one wave (``C x Hkv`` CTAs, all resident), so its time is
   ``T(m) = T0 + m * t_item``: the slope over ``m`` in {1, 2, 4, 8} is the time of one item of
   one CTA while every CTA streams its own, and the launch and tail costs ``T0`` drop out.
3. Least squares over L in {256 .. 8k} and group sizes {1, 4, 8} (Hkv 8, so Hq 8 / 32 / 64):
   ``t_item = a + alpha * rows + beta * kv``. Reported: beta in ns per key, alpha / beta and
   a / beta in keys. The planner has no constant term (a decode batch has one group size, so
   rows is constant there and a per-item overhead rides on ``alpha * rows``), so the line to
   paste comes from the fit without a constant, ``t_item = alpha' * rows + beta' * kv``,
   normalised to ``beta = 1``.

bf16, D 128, page 16, pages in a random order; device-event medians after warm-up
(benchmarks/common.py). Writes JSON and Markdown and prints the line for cost_model.py.

    python benchmarks/bench_cost_model.py --out benchmarks/results --commit <sha>
"""
from __future__ import annotations

import json

import numpy as np

from common import bench, cell, guarded, result_parser, run_info, write_results

HKV, D, PAGE = 8, 128, 16


def int_list(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(","))


def plan_columns(att) -> int:
    """CTAs per KV head of the load-balanced decode plan (read from a one-request probe plan)."""
    import torch

    from attngen.runtime import PagedKV

    i32 = dict(dtype=torch.int32, device="cuda")
    pages = torch.zeros(1, 2, PAGE, HKV, D, dtype=torch.bfloat16, device="cuda")
    kv = PagedKV(pages, torch.tensor([0, 1], **i32), torch.tensor([0], **i32), torch.tensor([PAGE], **i32))
    plan = att.plan_decode(kv, HKV, D, tensor_cores=True)  # the load-balanced plan, not the automatic choice
    if plan.work is None:
        raise RuntimeError("plan_decode did not make a load-balanced plan (tensor-core decode unavailable here)")
    return plan.work.bounds.num_ctas


def plan_matches(split, items: int, length: int, ctas: int) -> str:
    """'' when the host plan gives each of ``ctas`` CTAs ``items`` unsplit items of ``length`` keys, else why not."""
    per_cta = np.diff(split.cta_indptr)
    keys = split.work[:, 3] - split.work[:, 2]
    if len(per_cta) != ctas or np.any(per_cta != items):
        return f"items per CTA {sorted(set(per_cta.tolist()))}, expected {items} on each of {ctas}"
    if np.any(keys != length):
        return f"item lengths {sorted(set(keys.tolist()))}, expected {length}"
    if len(split.merge_tiles):
        return f"{len(split.merge_tiles)} merges, expected none"
    return ""


def measure_length(att, length: int, groups, items_list, ctas: int, reps: int) -> list[dict]:
    """Time every (group, items per CTA) launch over one cache of ``ctas * max(items)`` requests of ``length``."""
    import torch

    from attngen.runtime import PagedKV

    n_req, per_req = ctas * max(items_list), -(-length // PAGE)
    i32 = dict(dtype=torch.int32, device="cuda")
    pages = torch.randn(n_req * per_req, 2, PAGE, HKV, D, dtype=torch.bfloat16, device="cuda")
    indices = torch.randperm(n_req * per_req, device="cuda").to(torch.int32)
    indptr = torch.arange(n_req + 1, **i32) * per_req
    last = torch.full((n_req,), length - (per_req - 1) * PAGE, **i32)
    points = []
    for g in groups:
        for m in items_list:
            batch = m * ctas
            pt = {"kv": length, "rows": g, "items_per_cta": m, "batch": batch}
            # a prefix of the page table; the indices past indptr[-1] are spare capacity
            kv = PagedKV(pages, indptr[:batch + 1], indices, last[:batch])
            q = torch.randn(batch, g * HKV, D, dtype=torch.bfloat16, device="cuda")
            out, lse = torch.empty_like(q), torch.empty(batch, g * HKV, device="cuda")

            def run(kv=kv, q=q, out=out, lse=lse, pt=pt):
                plan = att.plan_decode(kv, int(q.shape[1]), D, tensor_cores=True)
                pt["plan_mismatch"] = plan_matches(plan.split, pt["items_per_cta"], pt["kv"], ctas)
                return bench(lambda: att.decode(q, kv, plan=plan, out=out, lse=lse), reps=reps)
            pt["ms"] = guarded(pt, "launch", run)
            points.append(pt)
            print(json.dumps(pt), flush=True)
            del q, out, lse
    del pages
    torch.cuda.empty_cache()
    return points


def item_times(points: list[dict]) -> list[dict]:
    """Per (kv, rows): the slope of launch time over items per CTA (µs per item) and its intercept."""
    usable = [p for p in points if p.get("ms") is not None and not p.get("plan_mismatch")]
    out = []
    for kv, rows in sorted({(p["kv"], p["rows"]) for p in usable}):
        pts = [p for p in usable if (p["kv"], p["rows"]) == (kv, rows)]
        if len({p["items_per_cta"] for p in pts}) < 2:
            continue
        slope, intercept = np.polyfit([p["items_per_cta"] for p in pts], [p["ms"] * 1e3 for p in pts], 1)
        out.append({"kv": kv, "rows": rows, "item_us": float(slope), "launch_us": float(intercept)})
    return out


def fit(items: list[dict]) -> dict:
    """Least squares of the item times, with and without the constant term."""
    if len(items) < 3:
        return {"error": f"{len(items)} (kv, rows) pairs with a slope; the fit needs at least 3"}
    rows = np.array([x["rows"] for x in items], float)
    kv = np.array([x["kv"] for x in items], float)
    t = np.array([x["item_us"] for x in items])
    (a, alpha, beta), *_ = np.linalg.lstsq(np.stack([np.ones_like(rows), rows, kv], 1), t, rcond=None)
    (alpha_p, beta_p), *_ = np.linalg.lstsq(np.stack([rows, kv], 1), t, rcond=None)
    full = a + alpha * rows + beta * kv
    planner = alpha_p * rows + beta_p * kv
    return {
        "a_us": float(a), "alpha_us": float(alpha), "beta_us": float(beta), "beta_ns_per_key": float(beta * 1e3),
        "alpha_keys": float(alpha / beta), "a_keys": float(a / beta),
        "per_group_alpha_keys": {int(g): float((a + alpha * g) / (g * beta)) for g in sorted(set(rows.tolist()))},
        "max_rel_residual": float(np.max(np.abs(full - t) / t)),
        "planner_form": {"alpha_us": float(alpha_p), "beta_us": float(beta_p), "alpha_keys": float(alpha_p / beta_p),
                         "max_rel_residual": float(np.max(np.abs(planner - t) / t))},
    }


def paste_line(res: dict) -> str:
    ratio = res["fit"]["planner_form"]["alpha_keys"]
    note = " (fit gave a negative alpha; clamped)" if ratio < 0 else ""
    return (f'    "decode": ({max(ratio, 0.0):.1f}, 1.0),  # bench_cost_model.py on {res["gpu"]}, {res["date"]}, '
            f'commit {res["commit"]}{note}')


def markdown(res: dict) -> list[str]:
    groups = sorted({x["rows"] for x in res["items"]})
    lines = [f"# Decode cost-model fit, bf16, Hkv {HKV}, D {D}, page {PAGE} — {res['gpu']}, {res['date']}, "
             f"commit {res['commit']}", "",
             f"{res['num_ctas']} plan columns (CTAs per KV head). Cells: µs per work item per CTA (the slope of the "
             f"launch time over {list(res['items_per_cta'])} items per CTA).", "",
             "| keys per item | " + " | ".join(f"group {g}" for g in groups) + " |", "|---|" + "---|" * len(groups)]
    for kv in sorted({x["kv"] for x in res["items"]}):
        by_g = {x["rows"]: x["item_us"] for x in res["items"] if x["kv"] == kv}
        lines.append(f"| {kv} | " + " | ".join(cell(by_g.get(g), ".2f") for g in groups) + " |")
    f = res["fit"]
    if "error" in f:
        lines += ["", f"No fit: {f['error']}"]
    else:
        per_g = ", ".join(f"group {g}: {v:.1f}" for g, v in f["per_group_alpha_keys"].items())
        lines += ["", f"Fit t = a + alpha * rows + beta * kv: beta = {f['beta_ns_per_key']:.3f} ns per key, "
                      f"alpha = {f['alpha_keys']:.1f} keys per row, a = {f['a_keys']:.1f} keys per item "
                      f"(max relative residual {f['max_rel_residual']:.1%}). Per-row cost with a folded in "
                      f"(a / rows + alpha), in keys: {per_g}.", "",
                  f"Planner form t = alpha' * rows + beta' * kv: alpha' / beta' = "
                  f"{f['planner_form']['alpha_keys']:.1f} keys per row (max relative residual "
                  f"{f['planner_form']['max_rel_residual']:.1%}). For attngen/schedules/cost_model.py:", "",
                  "```", res["paste_line"], "```"]
    bad = [p for p in res["points"] if p.get("plan_mismatch") or p.get("launch_error")]
    if bad:
        lines += ["", "Left out:", ""] + [f"- kv {p['kv']}, group {p['rows']}, {p['items_per_cta']} per CTA: "
                                          f"{p.get('launch_error') or p['plan_mismatch']}" for p in bad]
    return lines


def main():
    ap = result_parser(__doc__)
    ap.add_argument("--lengths", type=int_list, default=(256, 512, 1024, 2048, 4096, 8192), help="keys per item")
    ap.add_argument("--groups", type=int_list, default=(1, 4, 8), help="query heads per KV head")
    ap.add_argument("--items", type=int_list, default=(1, 2, 4, 8), help="work items per CTA")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    from attngen.runtime import CUDAAttention
    from attngen.variants import builtin

    res = run_info(args.commit)
    att = CUDAAttention.build(builtin("vanilla"), head_dims=(D,), dtypes=("bfloat16",), layouts=("NHD",),
                              kernels=("decode",), max_group_size=max(args.groups))
    res.update(num_kv_heads=HKV, head_dim=D, page_size=PAGE, items_per_cta=args.items, num_ctas=plan_columns(att),
               points=[])
    for length in args.lengths:
        res["points"] += measure_length(att, length, args.groups, args.items, res["num_ctas"], args.reps)
    res["items"] = item_times(res["points"])
    res["fit"] = fit(res["items"])
    if "error" not in res["fit"]:
        res["paste_line"] = paste_line(res)
    write_results(args.out, f"cost_model_{res['date']}", res, markdown(res))
    if "paste_line" in res:
        print("\nPaste into attngen/schedules/cost_model.py COST:\n" + res["paste_line"])


if __name__ == "__main__":
    main()
