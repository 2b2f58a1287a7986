"""Helpers shared by the benchmark scripts: CUDA-event medians, the copy-bandwidth ceiling, and the result
plumbing (the common options, run heading, peers measured under a guard, JSON + Markdown files).

torch is imported inside the functions that need it, so a script's ``--help`` runs without it.
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import numpy as np


def bench(fn, reps=30, warmup=10, inner=8) -> float:
    """Median device milliseconds of one ``fn`` call: each repetition enqueues a GPU sleep, then ``inner``
    back-to-back calls between two CUDA events, so the host is ahead of the GPU and the events time the
    kernels alone (what a serving loop or a CUDA graph sees), not the Python call overhead; see
    ``host_us`` for that. Every peer is timed the same way."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(4_000_000)  # ~2 ms of GPU time while the host enqueues the calls
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return float(np.median(times))


def time_prefill(att, q, kv, qo_indptr, head_dim: int, *, reps: int = 30, **plan_args):
    """(median device microseconds, out) of attngen's prefill of q [total_q, Hq, D] over ``kv`` under one plan
    (``plan_args`` to plan_prefill), into outputs filled with NaN first: a row left unwritten fails."""
    import torch

    plan = att.plan_prefill(qo_indptr, kv, head_dim, **plan_args)
    out = torch.full_like(q, float("nan"))
    lse = torch.empty(q.shape[:2], device=q.device)
    us = bench(lambda: att.prefill(q, kv, qo_indptr, plan=plan, out=out, lse=lse), reps=reps) * 1e3
    assert not out.isnan().any(), "attngen left rows unwritten"
    return us, out


def wall_times(fn, reps: int, warmup: int = 1) -> list[float]:
    """Wall-clock seconds of ``reps`` calls of ``fn`` after ``warmup`` untimed ones (host-side work: CPU kernels,
    planners)."""
    import time

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def host_us(fn, reps=200) -> float:
    """Median host microseconds of one ``fn`` call (the API's Python + launch overhead), the GPU kept busy
    by a sleep so that no call waits for it."""
    import time

    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps // 20):
        torch.cuda._sleep(20_000_000)
        for _ in range(20):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    return float(np.median(times))


def copy_bandwidth() -> float:
    """GB/s of a 2 GiB device-to-device copy on this GPU (read + write bytes)."""
    import torch

    x = torch.empty(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x), reps=20)
    return 2 * x.numel() * 2 / (ms * 1e-3) / 1e9


def result_parser(doc: str) -> argparse.ArgumentParser:
    """The options every benchmark takes (run_all.sh passes both): --out, --commit; ``doc`` (the module
    docstring) is the help text."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder of the result files")
    ap.add_argument("--commit", default="unknown", help="commit recorded in the results")
    return ap


def case_parser(doc: str, peers_help: str) -> argparse.ArgumentParser:
    """``result_parser`` and the options of the benchmarks that run a table of named cases: --no-peers (help:
    ``peers_help``), --tag and --cases (see ``selected_cases``)."""
    ap = result_parser(doc)
    ap.add_argument("--no-peers", dest="peers", action="store_false", help=peers_help)
    ap.add_argument("--tag", default="", help="suffix of the result files")
    ap.add_argument("--cases", default="", help="comma-separated prefixes of the case names to run (default: all)")
    return ap


# the scalar parameters the benchmarks run the built-ins with (bench_variants.py rows, ab_trees.py --variant)
VARIANT_PARAMS = {"rope": {"rope_scale": 1.0, "rope_theta": 1e4}, "logits_softcap": {"soft_cap": 30.0},
                  "sliding_window_causal": {"window_left": 1024}}


def alibi_slopes(num_heads: int):
    """ALiBi's slopes 2^(-8 (h + 1) / H) of H query heads, a float32 tensor on the GPU (the built-in alibi's
    ``alibi_slopes``)."""
    import torch

    return torch.tensor([2.0 ** (-8 * (h + 1) / num_heads) for h in range(num_heads)], device="cuda")


def selected_cases(cases: list, prefixes: str) -> list:
    """The cases (objects with a ``name``) whose names start with one of the comma-separated ``prefixes``, in the
    order of the prefixes (a run with a time limit measures first what is named first); all for an empty string."""
    if not prefixes:
        return list(cases)
    picked = [c for p in prefixes.split(",") for c in cases if c.name.startswith(p)]
    return [c for i, c in enumerate(picked) if c not in picked[:i]]


def git_commit() -> str:
    """The short hash of the checkout's HEAD (results name the commit they measured)."""
    import subprocess

    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent,
                          capture_output=True, text=True).stdout.strip()


def run_info(commit: str) -> dict:
    """The heading of every result file: GPU, date, commit and library versions."""
    import torch

    return {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU",
            "date": datetime.date.today().isoformat(), "commit": commit, "torch": torch.__version__,
            "flashinfer": load_flashinfer()[1]}


def load_flashinfer():
    """(the flashinfer module or None, its version or why it is missing): a missing peer is recorded, not fatal."""
    try:
        import flashinfer
    except Exception as e:  # noqa: BLE001
        return None, f"unavailable: {type(e).__name__}: {e}"[:300]
    return flashinfer, getattr(flashinfer, "__version__", "unknown")


def flex_call(q, k, v, mask_mod, score_mod=None):
    """FlexAttention (torch.compile'd) over one packed row, q [n, Hq, D], k / v [n, Hkv, D], with the block mask
    of ``mask_mod`` made here: (a call returning out [1, Hq, n, D], create_block_mask's milliseconds)."""
    import time

    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n = q.shape[0]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    bm = create_block_mask(mask_mod, 1, 1, n, n, device="cuda")
    torch.cuda.synchronize()
    create_ms = (time.perf_counter() - t0) * 1e3
    fx = torch.compile(flex_attention, dynamic=False)
    qs, ks, vs = (x.transpose(0, 1)[None] for x in (q, k, v))
    gqa = q.shape[1] != k.shape[1]
    return (lambda: fx(qs, ks, vs, score_mod=score_mod, block_mask=bm, enable_gqa=gqa)), create_ms


def guarded(row: dict, key: str, fn):
    """Run one peer's measurement; a failure is recorded as ``row[key + "_error"]`` and returns None, so one
    broken peer never stops the others."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        row[f"{key}_error"] = f"{type(e).__name__}: {e}"[:300]
        return None


def cell(x, spec: str = ".0f") -> str:
    """A Markdown table cell: the formatted number, or an em dash where the measurement is missing."""
    return "—" if x is None else format(x, spec)


def error_lines(rows: list[dict], label) -> list[str]:
    """A Markdown "Errors" section listing every ``*_error`` entry of ``rows`` (``label(row)`` names the row)."""
    errors = [f"- {label(r)}, {k[:-len('_error')]}: {v}" for r in rows for k, v in r.items() if k.endswith("_error")]
    return ["", "Errors:", ""] + errors if errors else []


def run_cases(cases: list, run) -> list[dict]:
    """``run(case)`` for each case in turn: its row printed as it completes (a run cut short keeps what it
    measured in its log), the CUDA caching allocator emptied between cases."""
    import torch

    rows = []
    for case in cases:
        rows.append(run(case))
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    return rows


def write_results(out_dir, stem: str, results: dict, md_lines: list[str]) -> None:
    """``<out_dir>/<stem>.json`` (everything measured) and ``<stem>.md`` (the summary tables), and the
    summary on stdout."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(results, indent=2))
    (out_dir / f"{stem}.md").write_text("\n".join(md_lines) + "\n")
    print("\n".join(md_lines))
