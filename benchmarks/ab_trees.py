"""A/B of whole source trees on the GPU: each tree's own runtime runs its own library.

``ab_libraries.py`` loads every revision's library with the current runtime, which breaks when a change
moves the FFI between Python and the entry functions. This script instead runs one process per tree
(``run``): that process imports the ``attngen`` package of the tree it is given, builds the causal or full
prefill libraries (NHD, one per head dim and dtype the prefill cases use) and vanilla decode libraries (bf16,
NHD, one per head dim the decode cases use; ``--variant``: a built-in variant on the decode and full-attention
prefill cases instead) through the public API, and times the cases of ``bench_prefill.py`` and ``bench_decode.py`` (``--cases``: name
prefixes) on inputs drawn from a fixed seed. It records each case's speed and a SHA-256 of the output bytes,
so ``report`` can say whether two trees compute bit-identical results as well as whether they run at the
same speed; ``--peers`` also times FlashInfer's two decode paths on each decode case in the same process.
Run the trees alternately (A, B, A, B): the spread between two runs of one tree is the noise the difference
is read against.

    python benchmarks/ab_trees.py run --tree /path/to/before --label before --json ab/before_1.json
    python benchmarks/ab_trees.py report ab/*.json --out benchmarks/results --tag registry
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _digest(t) -> str:
    """The first 16 hex digits of the SHA-256 of a tensor's bytes."""
    import torch

    return hashlib.sha256(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


def variant_params(name: str) -> dict:
    """The run-time parameters ``--variant name``'s calls pass (common.VARIANT_PARAMS; the others take none)."""
    from common import VARIANT_PARAMS, alibi_slopes  # (run put benchmarks/ on the path)

    if name == "alibi":  # the full-attention prefill cases have 32 query heads
        return {"alibi_slopes": alibi_slopes(32)}
    if name and name not in VARIANT_PARAMS and name not in ("vanilla", "sigmoid"):
        raise SystemExit(f"--variant {name}: the A/B knows the parameters of "
                         f"{', '.join(['vanilla', 'sigmoid', 'alibi', *VARIANT_PARAMS])} only")
    return VARIANT_PARAMS.get(name, {})


def run(args) -> None:
    tree = Path(args.tree).resolve()
    sys.path.insert(0, str(tree))  # this tree's attngen, not an installed one
    sys.path.insert(1, str(HERE))
    import torch

    import attngen
    from bench_decode import CASES as DECODE_CASES, flashinfer_decode, make_case as make_decode_case
    from bench_prefill import CASES as PREFILL_CASES, make_inputs as make_prefill_inputs
    from common import bench, load_flashinfer, selected_cases

    from attngen.runtime import CUDAAttention, PagedKV, RaggedKV
    from attngen.variants import builtin

    assert Path(attngen.__file__).resolve().is_relative_to(tree), f"imported {attngen.__file__}, not {tree}"
    res = {"label": args.label, "tree": str(tree), "gpu": torch.cuda.get_device_name(),
           "date": datetime.date.today().isoformat(), "variant": args.variant, "prefill": {}, "decode": {}}
    kinds = set(args.kinds.split(","))
    pre = {}  # (causal, head dim, dtype) -> the prefill library, built when a case first needs it

    def prefill_library(case):
        key = (case.causal, case.d, case.dtype)
        if key not in pre:
            name = args.variant or ("causal" if case.causal else "vanilla")
            pre[key] = CUDAAttention.build(builtin(name), head_dims=(case.d,), dtypes=(case.dtype,),
                                           layouts=("NHD",), kernels=("prefill",))
        return pre[key]

    params = variant_params(args.variant)
    if args.variant and args.peers:
        raise SystemExit("--peers times FlashInfer's plain decode: not with --variant")
    decode_cases = selected_cases(DECODE_CASES, args.cases) if "decode" in kinds else []
    dec = {d: CUDAAttention.build(builtin(args.variant or "vanilla"), head_dims=(d,), dtypes=("bfloat16",),
                                  layouts=("NHD",), kernels=("decode",)) for d in dict.fromkeys(c.d for c in decode_cases)}
    flashinfer = load_flashinfer()[0] if args.peers else None
    if args.peers:
        res["flashinfer"] = load_flashinfer()[1]
    for case in selected_cases(PREFILL_CASES, args.cases) if "prefill" in kinds else ():
        if args.variant and case.causal:
            continue  # a named variant brings its own mask: the full-attention cases time it
        torch.manual_seed(0)
        q, k, v, indptr = make_prefill_inputs(case)
        kv = RaggedKV(k, v, indptr)
        att = prefill_library(case)
        plan = att.plan_prefill(indptr, kv, case.d)
        out = torch.full_like(q, float("nan"))
        lse = torch.empty(q.shape[:2], device="cuda")
        ms = bench(lambda: att.prefill(q, kv, indptr, plan=plan, params=params, out=out, lse=lse), reps=args.reps)
        res["prefill"][case.name] = {"tflops": case.flops() / ms / 1e9, "out": _digest(out), "lse": _digest(lse)}
        print(args.label, case.name, f"{case.flops() / ms / 1e9:.1f} TFLOP/s", flush=True)
        del q, k, v, kv, out
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda") if flashinfer is not None else None
    for name, kv_lens, hq, hkv, d in decode_cases:
        torch.manual_seed(0)
        q, pages, indptr, indices, last = make_decode_case(kv_lens, hq, hkv, d)
        kv = PagedKV(pages, indptr, indices, last, "NHD")
        plan = dec[d].plan_decode(kv, hq, d)
        out = torch.full_like(q, float("nan"))
        lse = torch.empty(q.shape[:2], device="cuda")
        ms = bench(lambda: dec[d].decode(q, kv, plan=plan, params=params, out=out, lse=lse), reps=args.reps)
        nbytes = sum(kv_lens) * hkv * d * 2 * 2 + 2 * q.numel() * 2
        row = res["decode"][name] = {"GBps": nbytes / (ms * 1e-3) / 1e9, "us": ms * 1e3, "chunks": plan.num_chunks,
                                     "out": _digest(out), "lse": _digest(lse)}
        if flashinfer is not None:  # FlashInfer's best decode path on the same inputs
            paths = [flashinfer_decode(flashinfer, ws, tc, indptr, indices, last, hq, hkv, d) for tc in (False, True)]
            row["flashinfer_us"] = min(bench(lambda: w.run(q, pages), reps=args.reps) * 1e3 for w in paths)
            row["flashinfer_maxdiff"] = max(float((w.run(q, pages).float() - out.float()).abs().max()) for w in paths)
        print(args.label, name, f"{row['GBps']:.0f} GB/s", flush=True)
        del q, pages, kv, out
        torch.cuda.empty_cache()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=1))


def report(args) -> None:
    runs = [json.loads(Path(p).read_text()) for p in args.json]
    labels = list(dict.fromkeys(r["label"] for r in runs))
    by_label = defaultdict(list)
    for r in runs:
        by_label[r["label"]].append(r)
    lines = [f"# A/B of source trees — {runs[0]['gpu']}, {runs[0]['date']}", "",
             f"Trees: {', '.join(labels)}; {len(runs)} runs, alternating. Each cell: the median over that tree's "
             "runs of the case, then every run in brackets (runs may time different cases). 'same output': the "
             "SHA-256 of out and lse is identical across every run of every tree.", ""]
    for kind, unit in (("prefill", "tflops"), ("decode", "GBps")):
        cases = list(dict.fromkeys(case for r in runs for case in r[kind]))
        if not cases:
            continue
        peers = any("flashinfer_us" in row for r in runs for row in r[kind].values())
        lines += [f"{kind} ({'TFLOP/s' if unit == 'tflops' else 'GB/s'}):", "",
                  "| case | " + " | ".join(labels) + f" | {labels[-1]} / {labels[0]} | same output |"
                  + (" FlashInfer's best, us (median of the runs timing it) |" if peers else ""),
                  "|---|" + "---|" * (len(labels) + 2 + peers)]
        for case in cases:
            meds, cells = {}, []
            for lab in labels:
                vals = [r[kind][case][unit] for r in by_label[lab] if case in r[kind]]
                meds[lab] = statistics.median(vals)
                cells.append(f"{meds[lab]:.0f} [" + ", ".join(f"{v:.0f}" for v in vals) + "]")
            timed = [r[kind][case] for r in runs if case in r[kind]]
            same = len({(row["out"], row["lse"]) for row in timed}) == 1
            fi = [row["flashinfer_us"] for row in timed if "flashinfer_us" in row]
            lines.append(f"| {case} | " + " | ".join(cells) + f" | {meds[labels[-1]] / meds[labels[0]]:.3f} | "
                         + ("yes" if same else "no") + " |"
                         + (f" {statistics.median(fi):.2f} |" if fi else " — |" if peers else ""))
        lines.append("")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"ab_trees_{runs[0]['date']}" + (f"_{args.tag}" if args.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(runs, indent=1))
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="time one tree (on the GPU)")
    r.add_argument("--tree", required=True, help="a directory holding an attngen package")
    r.add_argument("--label", required=True)
    r.add_argument("--json", required=True)
    r.add_argument("--reps", type=int, default=30)
    r.add_argument("--kinds", default="prefill,decode", help="what to build and time: prefill, decode or both")
    r.add_argument("--variant", default="", help="a built-in variant the decode cases and the full-attention "
                   "prefill cases run instead of plain attention (the causal prefill cases are skipped)")
    r.add_argument("--cases", default="", help="comma-separated prefixes of the case names to time (default: all)")
    r.add_argument("--peers", action="store_true", help="also time FlashInfer's decode paths on each decode case")
    p = sub.add_parser("report", help="the table of several runs")
    p.add_argument("json", nargs="+")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--tag", default="")
    args = ap.parse_args()
    run(args) if args.cmd == "run" else report(args)


if __name__ == "__main__":
    main()
