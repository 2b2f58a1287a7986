"""A model-level decode step on the GPU, its KV cache attngen's or TVM's own.

The Llama-shaped decoder of examples/tvm_model_e2e.py at 7B-like layer sizes (hidden 4096, Hq 32 / Hkv 8,
D 128, MLP 11008, float16, random weights; ``--layers``, default 4) is compiled into three CUDA model
libraries that differ only in their cache: attngen's slots in the "tirx" and the "flashinfer" convention,
and TVM's own TIR CUDA kernels. Each gets ``--batch`` sequences (default 32) of ``--context`` cached tokens
(default 2048, prefilled in chunks), then decode steps of one token per sequence are timed end to end
(``kv_state_begin_forward``, the forward, ``kv_state_end_forward``, then a device sync): medians after
warm-up. A few more steps run under torch.profiler, whose CUPTI trace holds every kernel of the process
(TVM's included): the GPU time per step of all kernels and of the attention kernels (names that say
decode, prefill, attention or merge, as the union of their spans: a split-KV merge launched as a
programmatic dependent runs beside the decode kernel; the KV append is counted apart), so the
attention slots' own share is not hidden by the host-side cost of a step. The last step's logits of the
three models are compared, and the attention kernels' launch shapes (grid, block, shared memory, registers)
are read from the profiler's trace. Writes JSON and a Markdown table.

    python benchmarks/bench_tvm_model.py --out benchmarks/results --commit <sha>
"""
from __future__ import annotations

import json
import re
import runpy
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from common import cell, result_parser, run_info, write_results

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tvm_model_e2e.py"
CACHES = (("attngen", "tirx"), ("attngen", "flashinfer"), ("tvm", "tirx"))


def label(kv_cache: str, convention: str) -> str:
    return f"attngen {convention}" if kv_cache == "attngen" else "tvm kernels"


def fill(model, batch: int, context: int, chunk: int, rng, vocab: int) -> None:
    """``batch`` sequences of ``context`` tokens, prefilled a few sequences per forward (at most ``chunk`` tokens)."""
    for s in range(batch):
        model.builtin("kv_state_add_sequence", s)
    per = max(1, chunk // context)
    for first in range(0, batch, per):
        ids = list(range(first, min(batch, first + per)))
        model.step(ids, [list(rng.integers(0, vocab, context)) for _ in ids])


def time_steps(model, batch: int, steps: int, warmup: int, rng, vocab: int) -> tuple[list[float], np.ndarray]:
    """Wall milliseconds of each timed decode step (after ``warmup`` untimed ones), and the last step's logits."""
    ids = list(range(batch))
    times, logits = [], None
    for i in range(warmup + steps):
        toks = [[int(t)] for t in rng.integers(0, vocab, batch)]
        model.dev.sync()
        t = time.perf_counter()
        logits = model.step(ids, toks)  # (copies the logits to the host: part of a serving step too)
        model.dev.sync()
        if i >= warmup:
            times.append((time.perf_counter() - t) * 1e3)
    return times, logits


ATTENTION = re.compile(r"decode|prefill|attention|merge", re.IGNORECASE)
APPEND = re.compile(r"append", re.IGNORECASE)


def is_attention(name: str) -> bool:
    """An attention kernel's name (the KV append counted apart)."""
    return bool(ATTENTION.search(name)) and not APPEND.search(name)


def union_length(spans: list) -> float:
    """Length of the union of (start, end) intervals."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        covered += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return covered


def launch_shapes(trace: dict, pattern: re.Pattern) -> dict[str, list[str]]:
    """The launch shapes of the kernels whose names match ``pattern`` in a profiler's Chrome trace (its kernel
    events' args: grid, block, dynamic shared memory, registers): {name: ["grid X x Y x Z, block B, smem S B,
    R regs", ...]}, each distinct shape once, in the order they first ran. Two launches of one kernel that
    differ in grid (a split-KV decode's chunks) show as two shapes."""
    shapes: dict[str, list[str]] = {}
    for ev in trace.get("traceEvents", []):
        if ev.get("cat") != "kernel" or not pattern.search(ev.get("name", "")):
            continue
        args = ev.get("args", {})
        grid = "x".join(str(n) for n in args.get("grid", ())) or "?"
        block = "x".join(str(n) for n in args.get("block", ())) or "?"
        shape = (f"grid {grid}, block {block}, smem {args.get('shared memory', '?')} B, "
                 f"{args.get('registers per thread', '?')} regs")
        seen = shapes.setdefault(ev["name"], [])
        if shape not in seen:
            seen.append(shape)
    return shapes


def kernel_times(model, batch: int, steps: int, rng, vocab: int) -> dict:
    """GPU microseconds per decode step: all kernels, attention kernels, KV append; the heaviest kernels; the
    attention kernels' launch shapes."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    ids = list(range(batch))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            model.step(ids, [[int(t)] for t in rng.integers(0, vocab, batch)])
        model.dev.sync()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
        trace = json.loads((Path(tmp) / "trace.json").read_text())
    shapes = {n: s for n, s in launch_shapes(trace, ATTENTION).items() if is_attention(n)}
    by_name: dict[str, float] = {}
    launches: dict[str, int] = {}
    # (start, end) of every kernel, attention kernels apart: a programmatic dependent (attngen's kernels) may
    # start while the kernel before it still runs (its CTAs wait on the SMs that kernel's tail freed), so
    # durations overlap. Attention's cost is what it adds to the GPU's busy time: the union of all spans minus
    # the union of the other kernels' spans; the union of the attention spans alone is reported beside it.
    spans, other = [], []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0:
            by_name[ev.name] = by_name.get(ev.name, 0.0) + ev.device_time_total / steps
            launches[ev.name] = launches.get(ev.name, 0) + 1
            (spans if is_attention(ev.name) else other).append((ev.time_range.start, ev.time_range.end))
    covered = union_length(spans)
    busy = union_length(spans + other)
    added = busy - union_length(other)
    append = sum(t for n, t in by_name.items() if APPEND.search(n))
    attention = sum(t for n, t in by_name.items() if is_attention(n))
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:8]
    att = sorted(((n, t) for n, t in by_name.items() if ATTENTION.search(n)), key=lambda kv: -kv[1])
    return {"gpu_us": sum(by_name.values()), "gpu_busy_us": busy / steps, "attention_us": added / steps,
            "attention_span_us": covered / steps, "attention_kernel_sum_us": attention,
            "append_us": append,
            "top_kernels_us": [[n[:120], round(t, 1)] for n, t in top],
            "attention_kernels_us": [[n[:200], round(t, 1), launches[n] / steps] for n, t in att],
            "attention_launch_shapes": [[n[:200], shape] for n, shape in shapes.items()]}


def main():
    ap = result_parser(__doc__)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--arch", default=None, help="the GPU's arch (default: this GPU's)")
    args = ap.parse_args()

    from attngen.runtime.cuda import current_arch

    example = runpy.run_path(str(EXAMPLE))
    chunk = 4096
    cfg = replace(example["llama"](128), name="llama_7b_layers", vocab=1024, hidden=4096, num_layers=args.layers,
                  num_qo_heads=32, num_kv_heads=8, intermediate=11008, max_batch=args.batch,
                  max_total_tokens=args.batch * (args.context + args.steps + 16 + example["PAGE_SIZE"]),
                  prefill_chunk=max(chunk, args.context))  # a forward holds one whole sequence at least
    res = run_info(args.commit) | {"model": {k: getattr(cfg, k) for k in ("hidden", "num_layers", "num_qo_heads",
                                                                            "num_kv_heads", "head_dim", "intermediate",
                                                                            "vocab")},
                                   "batch": args.batch, "context": args.context, "rows": []}
    logits, weights = {}, None
    with tempfile.TemporaryDirectory() as tmp:
        for kv_cache, convention in CACHES:
            row = {"cache": label(kv_cache, convention)}
            try:
                t = time.perf_counter()
                executable, names = example["compile_model"](cfg, kv_cache, Path(tmp), None, "cuda",
                                                             args.arch or current_arch(), convention)
                row["compile_s"] = time.perf_counter() - t
                weights = weights or example["random_weights"](cfg, names, 0)
                model = example["RunningModel"](executable, weights, names, "cuda")
                rng = np.random.default_rng(1)
                fill(model, args.batch, args.context, chunk, rng, cfg.vocab)
                times, logits[row["cache"]] = time_steps(model, args.batch, args.steps, 5, rng, cfg.vocab)
                row |= {"step_ms": float(np.median(times)), "step_ms_min": float(np.min(times)),
                        "max_abs_logit": float(np.abs(logits[row["cache"]]).max())}
                row |= kernel_times(model, args.batch, 5, rng, cfg.vocab)
                del model
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
    ref = logits.get("tvm kernels")
    for row in res["rows"]:
        if ref is not None and row["cache"] in logits:
            row["max_abs_logit_diff"] = float(np.abs(logits[row["cache"]] - ref).max())
        if ref is not None and row.get("step_ms"):
            tvm_ms = next(r.get("step_ms") for r in res["rows"] if r["cache"] == "tvm kernels")
            row["tvm_over_this"] = tvm_ms / row["step_ms"] if tvm_ms else None
            tvm_att = next(r.get("attention_us") for r in res["rows"] if r["cache"] == "tvm kernels")
            row["tvm_attention_over_this"] = tvm_att / row["attention_us"] if tvm_att and row.get("attention_us") \
                else None
    m = res["model"]
    lines = [f"# Model-level decode step, Llama-shaped ({m['num_layers']} layers, hidden {m['hidden']}, Hq "
             f"{m['num_qo_heads']} / Hkv {m['num_kv_heads']}, D {m['head_dim']}, float16), batch {args.batch}, "
             f"context {args.context} — {res['gpu']}, {res['date']}, commit {res['commit']}", "",
             "| cache | step ms (median, wall) | TVM kernels / this (wall) | GPU busy us / step | "
             "attention us / step (added busy time) | attention kernels' span us | TVM kernels / this (attention) | "
             "KV append us / step | max abs logit diff vs TVM kernels (max abs logit) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['cache']} | {cell(r.get('step_ms'), '.3f')} | {cell(r.get('tvm_over_this'), '.2f')} | "
                     f"{cell(r.get('gpu_busy_us'), '.0f')} | {cell(r.get('attention_us'), '.0f')} | "
                     f"{cell(r.get('attention_span_us'), '.0f')} | "
                     f"{cell(r.get('tvm_attention_over_this'), '.2f')} | {cell(r.get('append_us'), '.0f')} | "
                     f"{cell(r.get('max_abs_logit_diff'), '.2e')} ({cell(r.get('max_abs_logit'), '.1f')}) |")
    lines += ["", "Heaviest kernels per step (us):"] + [
        f"- {r['cache']}: " + "; ".join(f"{n} {t}" for n, t in r.get("top_kernels_us", [])) for r in res["rows"]]
    lines += ["", "Attention kernels per step (us):"] + [
        f"- {r['cache']}: " + "; ".join(f"`{n}` {t} ({k:g} launches)" for n, t, k in r.get("attention_kernels_us", []))
        for r in res["rows"]]
    lines += ["", "Attention kernels' launch shapes (from the profiler's trace):"] + [
        f"- {r['cache']}: " + "; ".join(f"`{n[:60]}`: " + " / ".join(s)
                                        for n, s in r.get("attention_launch_shapes", []))
        for r in res["rows"]]
    lines += [f"- {r['cache']}: {r['error']}" for r in res["rows"] if "error" in r]
    write_results(args.out, f"tvm_model_{res['date']}", res, lines)


if __name__ == "__main__":
    main()
