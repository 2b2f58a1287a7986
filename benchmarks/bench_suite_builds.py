"""What the GPU suite's builds cost in compiler time, whole-program against linked.

Builds the instantiations the GPU tests run (``tests/test_cuda_codegen.py`` ``INSTANTIATIONS``: every built-in
at head_dim 128 / bf16 plus the other head dims and dtypes of two variants; decode and prefill, both page
layouts) for one arch into a fresh build cache per link mode, one after another, and records per build the
wall seconds and the CPU seconds of this process and its children (nvcc, cicc, ptxas, the host compiler,
nvJitLink in-process). Linked builds (``link="lto"``) compile each template object once per hook signature and
defer the alternatives the runtime never picks on sm_90a (the CUDA-core decode, the mma.sync prefill: linked on
first use, which the GPU tests that force them then pay). Writes ``<out>/suite_builds_<date>.md``.

    python benchmarks/bench_suite_builds.py --arch sm_90a --cores 1
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import git_commit, write_results  # noqa: E402


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--links", default="whole,lto")
    ap.add_argument("--cores", type=int, default=1, help="ATTNGEN_BUILD_CORES of the builds (the suite's share)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    os.environ["ATTNGEN_BUILD_CORES"] = str(args.cores)

    from attngen.codegen.cache import BuildCache
    from attngen.codegen.pipeline import run_pipeline
    from attngen.schedules import BuildConfig
    from attngen.variants import builtin
    from tests.test_cuda_codegen import INSTANTIATIONS

    rows, totals = {}, {}
    for link in args.links.split(","):
        cache = BuildCache(tempfile.mkdtemp(prefix=f"suite_builds_{link}_"))
        extra = {} if link == "whole" else {"link": link}
        wall0, cpu0 = time.perf_counter(), cpu_seconds()
        for name, d, dt in INSTANTIATIONS:
            t, c = time.perf_counter(), cpu_seconds()
            run_pipeline(builtin(name), BuildConfig("cuda", (d,), (dt,), (args.arch,), **extra), cache=cache)
            rows.setdefault((name, d, dt), {})[link] = (time.perf_counter() - t, cpu_seconds() - c)
            print(link, name, d, dt, *(f"{x:.1f}" for x in rows[(name, d, dt)][link]), flush=True)
        totals[link] = (time.perf_counter() - wall0, cpu_seconds() - cpu0)

    links = list(totals)
    commit = git_commit()
    lines = [f"# The GPU tests' builds, whole-program against linked — {datetime.date.today().isoformat()}", "",
             f"`python benchmarks/bench_suite_builds.py --arch {args.arch} --cores {args.cores}` at {commit} on "
             f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), load average "
             f"{os.getloadavg()[0]:.1f} at the end; each mode a fresh cache, decode + prefill, both page "
             "layouts. Seconds: wall / CPU (this process and its children).", "",
             "| variant | head dim | dtype | " + " | ".join(links) + " |", "|---|---|---|" + "---|" * len(links)]
    for (name, d, dt), by in rows.items():
        lines.append(f"| {name} | {d} | {dt} | " + " | ".join(f"{by[k][0]:.1f} / {by[k][1]:.1f}" for k in links)
                     + " |")
    lines.append("| **all** | | | " + " | ".join(f"**{totals[k][0]:.1f} / {totals[k][1]:.1f}**" for k in links)
                 + " |")
    results = {"commit": commit, "arch": args.arch, "cores": args.cores, "totals": totals,
               "builds": [{"variant": n, "head_dim": d, "dtype": dt, **by} for (n, d, dt), by in rows.items()]}
    write_results(args.out, f"suite_builds_{datetime.date.today().isoformat()}", results, lines)


if __name__ == "__main__":
    main()
