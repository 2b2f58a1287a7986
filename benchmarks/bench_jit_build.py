"""Build time of a prefill module from a cold cache: attngen's build of the causal prefill (whole-program and
linked) beside FlashInfer's JIT of its fa3 and fa2 batch prefill for the same case, on the machine it runs on.

Each measurement runs in a fresh process with an empty cache of its own (``ATTNGEN_CACHE_DIR`` /
``FLASHINFER_WORKSPACE_BASE`` in a new temporary directory), so nothing is reused between rows or runs:

  attngen whole    ``CUDAAttention.build(causal, head_dims=(D,), dtypes=(dtype,), kernels=("prefill",),
                   layouts=("NHD",))`` for the GPU's arch (sm_90a on Hopper: both prefill templates)
  attngen linked   the same with ``link="lto"`` (the template objects compiled, the hooks linked in)
  FlashInfer fa3 / fa2
                   ``BatchPrefillWithRaggedKVCacheWrapper(backend=...)``: plan and one run of a causal batch,
                   which JIT-compiles the module it needs (benchmarks/jit_peers.py ``warm``)

Seconds are wall time of the build step inside the process (imports excluded), and the whole process. Both
compilers use every core (attngen: ``ATTNGEN_BUILD_CORES``, default the machine's; FlashInfer: ``MAX_JOBS``,
default its own choice). Writes ``jit_build_<date>{tag}.{json,md}``.

    python benchmarks/bench_jit_build.py --out benchmarks/results --commit <sha> [--head-dim 128] [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import result_parser, run_info, write_results  # noqa: E402

ROWS = ("attngen whole", "attngen linked", "FlashInfer fa3", "FlashInfer fa2")
HQ, HKV = 32, 8


def measure(row: str, d: int, dtype: str, arch: str) -> dict:
    """One row, in this process (a fresh one: main starts it): the build step's wall seconds."""
    import torch  # noqa: F401  (imported before the clock starts, as the build's caller has it)

    if row.startswith("attngen"):
        from attngen.runtime import CUDAAttention
        from attngen.variants import builtin

        v = builtin("causal")
        link = "lto" if row == "attngen linked" else "whole"
        t = time.perf_counter()
        archs = (arch,) if arch else None  # None: the GPU's
        CUDAAttention.build(v, head_dims=(d,), dtypes=(dtype,), kernels=("prefill",), layouts=("NHD",), link=link,
                            archs=archs)
        return {"build_s": time.perf_counter() - t}
    from jit_peers import warm

    t = time.perf_counter()
    warm(d, dtype, HQ, HKV, True, row.split()[-1])
    return {"build_s": time.perf_counter() - t}


def run_row(row: str, d: int, dtype: str, arch: str) -> dict:
    """Starts a process for ``row`` with empty caches; its result and the process's wall seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, ATTNGEN_CACHE_DIR=str(Path(tmp) / "attngen"), FLASHINFER_WORKSPACE_BASE=tmp)
        t = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, "--one", row, "--head-dim", str(d), "--dtype", dtype,
                            "--arch", arch],
                           env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
    if p.returncode != 0:
        return {"row": row, "error": (p.stderr or p.stdout)[-600:], "process_s": wall}
    return {"row": row, **json.loads(p.stdout.strip().splitlines()[-1]), "process_s": wall}


def markdown(res: dict) -> list[str]:
    lines = [f"# Prefill build time from a cold cache — {res['gpu']}, {res['date']}, commit {res['commit']}", "",
             f"Machine: {res['cores']} cores; attngen's arch {res['arch']}. Causal batch prefill, D {res['head_dim']}, "
             f"{res['dtype']}, Hq {HQ} / "
             f"Hkv {HKV}; each row a fresh process with an empty cache (benchmarks/bench_jit_build.py). FlashInfer "
             f"{res['flashinfer']}.", "", "| build | build step s | process s |", "|---|---|---|"]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"| {r['row']} | failed: {r['error'].splitlines()[-1][:120]} | {r['process_s']:.1f} |")
        else:
            lines.append(f"| {r['row']} | {r['build_s']:.1f} | {r['process_s']:.1f} |")
    return lines


def main() -> None:
    ap = result_parser(__doc__)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--arch", default="", help="attngen's target arch (default: the GPU's; sm_90a to time the "
                                               "build on a machine without one)")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated rows (default: {', '.join(ROWS)})")
    ap.add_argument("--tag", default="", help="suffix of the result files")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:  # a measuring process: one JSON line on stdout
        print(json.dumps(measure(args.one, args.head_dim, args.dtype, args.arch)))
        return
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise SystemExit(f"--rows: unknown {unknown}; one of {list(ROWS)}")
    res = run_info(args.commit) | {"cores": os.cpu_count(), "head_dim": args.head_dim, "dtype": args.dtype,
                                   "arch": args.arch or "the GPU's", "rows": []}
    for row in rows:
        res["rows"].append(run_row(row, args.head_dim, args.dtype, args.arch))
        print(res["rows"][-1], flush=True)
    write_results(args.out, f"jit_build_{res['date']}{args.tag}", res, markdown(res))


if __name__ == "__main__":
    main()
