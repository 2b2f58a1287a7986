"""How long building takes on this machine: wall seconds of ``attngen`` commands, each a new process, as a
user runs them.

Per arch (``--arch``, default sm_80 and sm_90a), a CUDA build of a soft-capped variant (a file whose hook
body holds the cap 30; D 128, bf16, the default templates and layouts):

  cold cache        the first build, into a fresh ATTNGEN_CACHE_DIR
  cache hit         the same command again (a new process)
  new variant       another variant (the built-in ``causal``) into the now warm cache
  one-constant edit the file's cap edited to 31 in the hook body, built again

and, once, ``attngen --help`` and ``attngen list`` (the first ``list`` into a fresh cache, then again).
Every row measures whatever the build does today; nothing is skipped or faked. Writes a Markdown table to
``<out>/build_<date>_<host>.md`` with the machine (cores, CPU model, load), date and commit.

    python benchmarks/bench_build.py --arch sm_90a
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SOFTCAP_FILE = '''"""Soft-capped logits, the cap a constant of the hook body."""
from tvm.script import tirx as T

from attngen import Variant


@T.prim_func
def softcap(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
            kv_head: T.int32) -> T.float32:
    return T.float32({cap}) * T.tanh(s / T.float32({cap}))


variant = Variant("bench_softcap", logits_transform=softcap)
'''


def attngen(args: list[str], cache_dir: Path) -> tuple[float, str]:
    """(wall seconds, output) of one ``attngen`` command in a new process; raises if it fails."""
    env = dict(os.environ, ATTNGEN_CACHE_DIR=str(cache_dir),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("ATTNGEN_DUMP", None)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "attngen.cli", *args], env=env, capture_output=True, text=True,
                       cwd=ROOT)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"attngen {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}")
    return seconds, p.stdout


def outcome(output: str) -> str:
    """What the build reported: a cache hit or a compile, and its own seconds."""
    for line in output.splitlines():
        if line.startswith("attngen: cache hit") or line.startswith("attngen: compiled"):
            return line.split(" -> ")[0].removeprefix("attngen: ")
    return ""


def machine() -> dict:
    model = "unknown"
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=ROOT).stdout.strip()
    return {"host": socket.gethostname(), "cores": os.cpu_count(), "cpu": model, "os": platform.platform(),
            "python": platform.python_version(), "nvcc": nvcc[-1] if nvcc else "none",
            "commit": commit + (" (with uncommitted changes)" if dirty else ""),
            "load": " ".join(f"{x:.2f}" for x in os.getloadavg())}


def bench_arch(arch: str, work: Path, head_dim: int, dtype: str) -> list[tuple[str, float, str]]:
    cache = work / f"cache-{arch}"
    variant = work / f"softcap_{arch}.py"
    variant.write_text(SOFTCAP_FILE.format(cap="30.0"))
    build = ["build", "--target", "cuda", "--arch", arch, "--head-dim", str(head_dim), "--dtype", dtype]
    rows = []
    for name, source, cap in [("cold cache", variant, None), ("cache hit (new process)", variant, None),
                              ("new variant (causal, warm cache)", "causal", None),
                              ("one-constant edit (cap 30 -> 31)", variant, "31.0")]:
        if cap is not None:
            variant.write_text(SOFTCAP_FILE.format(cap=cap))
        seconds, out = attngen([build[0], str(source), *build[1:]], cache)
        rows.append((f"{arch}: {name}", seconds, outcome(out)))
        print(f"{rows[-1][0]:48s} {seconds:8.2f} s  {rows[-1][2]}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_80,sm_90a", help="comma-separated archs (default: sm_80,sm_90a)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="folder of the result file")
    args = ap.parse_args()
    info = machine()
    start = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        work = Path(tmp)
        for label, cmd in [("attngen --help", ["--help"]), ("attngen list (fresh cache)", ["list"]),
                           ("attngen list (again)", ["list"])]:
            seconds, _ = attngen(cmd, work / "cache-cli")
            rows.append((label, seconds, ""))
            print(f"{label:48s} {seconds:8.2f} s", flush=True)
        for arch in (a.strip() for a in args.arch.split(",") if a.strip()):
            rows += bench_arch(arch, work, args.head_dim, args.dtype)
    minutes = (datetime.datetime.now(datetime.timezone.utc) - start).total_seconds() / 60
    lines = [
        f"# attngen build times, {start:%Y-%m-%d %H:%M} UTC",
        "",
        f"Machine: {info['host']}, {info['cores']} cores, {info['cpu']}; {info['os']}; load average at start "
        f"{info['load']}, end {' '.join(f'{x:.2f}' for x in os.getloadavg())} (shared machine: other "
        "processes ran too).",
        f"Commit {info['commit']}; Python {info['python']}; nvcc {info['nvcc']}.",
        "",
        f"Wall seconds of each `attngen` command in a new process (`{Path(sys.argv[0]).name}`), CUDA builds of "
        f"D {args.head_dim}, {args.dtype}, default templates (decode, prefill) and layouts (NHD, HND). "
        f"The run took {minutes:.1f} min.",
        "",
        "| command | wall s | build reported |",
        "|---|---:|---|",
        *[f"| {name} | {seconds:.2f} | {what} |" for name, seconds, what in rows],
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"build_{start:%Y-%m-%d}_{info['host']}.md"
    path.write_text("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
