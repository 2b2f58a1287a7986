"""What the GPU suite compiles, measured on a machine without a GPU: a pytest plugin and its summary.

As a plugin, it tells torch of one sm_90 device, so that the GPU tests are collected and run; each test then
builds what it asks for before its first GPU operation fails. Every ``attngen.build`` call and every build-cache
miss (a library, a template object, a support library) is timed and appended to a JSON-lines log with the test
that asked for it. Builds a test makes after its first GPU operation are not seen: the log is a lower bound.

    PYTHONPATH=benchmarks DRY_LOG=/tmp/dry.jsonl python -m pytest -m gpu -n 2 tests -q -p gpu_suite_dry_builds
    python benchmarks/gpu_suite_dry_builds.py /tmp/dry.jsonl [--out benchmarks/results] [--commit <sha>]

The second command writes ``gpu_suite_dry_builds_<date>.{json,md}``: the distinct builds, their seconds, and
the seconds by test file.
"""
from __future__ import annotations

import collections
import datetime
import json
import os
import platform
import time
from pathlib import Path

from common import result_parser, write_results

LOG_ENV = "DRY_LOG"
_current = {"test": None}


def _log(record: dict) -> None:
    record.update(test=_current["test"], pid=os.getpid())
    with open(os.environ.get(LOG_ENV, "gpu_suite_dry_builds.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def pytest_runtest_setup(item):
    _current["test"] = item.nodeid


def pytest_configure(config):
    import torch

    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.device_count = lambda: 1

    import attngen.build as build_module
    import attngen.runtime.cuda as runtime_cuda
    import attngen.tvm.cuda as tvm_cuda
    from attngen.codegen.cache import BuildCache

    original_build = build_module.build

    def timed_build(variant, cfg, *args, **kwargs):
        start = time.time()
        try:
            return original_build(variant, cfg, *args, **kwargs)
        finally:
            _log({"kind": "build", "variant": getattr(variant, "name", str(variant)), "cfg": repr(cfg),
                  "s": round(time.time() - start, 2)})

    build_module.build = runtime_cuda.build_library = tvm_cuda.build = timed_build
    original_get = BuildCache.get_or_build

    def timed_get(self, key, build, *, counted=True):
        start = time.time()
        path, hit = original_get(self, key, build, counted=counted)
        if not hit:
            _log({"kind": "miss", "key": key, "s": round(time.time() - start, 2)})
        return path, hit

    BuildCache.get_or_build = timed_get


def summarise(log: Path) -> tuple[dict, dict]:
    """(key -> seconds of its build, test file -> seconds of the builds it made) over the log's cache misses
    (the longest where a key was built twice: two workers waiting on one lock)."""
    seconds, by_file = {}, collections.Counter()
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] != "miss" or rec["s"] < 0.5:  # (below: a stand-in entry or a record, not a compile)
            continue
        seconds[rec["key"]] = max(seconds.get(rec["key"], 0.0), rec["s"])
        by_file[(rec["test"] or "?").split("::")[0]] += rec["s"]
    return seconds, dict(by_file)


def main() -> None:
    ap = result_parser(__doc__)
    ap.add_argument("log", type=Path, help="the plugin's JSON-lines log")
    args = ap.parse_args()
    seconds, by_file = summarise(args.log)
    date = datetime.date.today().isoformat()
    lines = [f"# The GPU suite's builds, dry run without a GPU — {date}, commit {args.commit}", "",
             f"`benchmarks/gpu_suite_dry_builds.py` on {os.cpu_count()} cores ({platform.machine()}): "
             f"{len(seconds)} distinct builds, {sum(seconds.values()):.0f} s of build time (a lower bound: builds "
             "after a test's first GPU operation are not reached).",
             "", "| test file | seconds of builds |", "|---|---|"]
    lines += [f"| {f} | {s:.1f} |" for f, s in sorted(by_file.items(), key=lambda kv: -kv[1])]
    write_results(args.out, f"gpu_suite_dry_builds_{date}",
                  {"date": date, "commit": args.commit, "cores": os.cpu_count(), "build_seconds": seconds,
                   "by_test_file": by_file}, lines)


if __name__ == "__main__":
    main()
