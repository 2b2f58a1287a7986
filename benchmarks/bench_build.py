"""How long building takes on this machine: wall seconds of ``attngen`` commands, each a new process, as a
user runs them.

Per arch (``--arch``, default sm_80 and sm_90a), a CUDA build of a soft-capped variant (a file whose hook
body holds the cap 30; D 128, bf16, the default templates and layouts):

  cold cache        the first build, into a fresh ATTNGEN_CACHE_DIR
  cache hit         the same command again (a new process)
  new variant, same hook signature
                    another file's variant (``tanh(s) * 4``: a logits hook of the soft-cap's signature, so
                    its template objects are cached) into the now warm cache
  new variant, new signature
                    another variant (the built-in ``causal``: a mask hook, its own template objects)
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

# a different logits hook whose hook signature (the ABI traits: the hooks present, their row terms, the flags)
# is the soft-cap's: a link-time build takes the soft-cap's template objects from the cache
TANH_FILE = SOFTCAP_FILE.replace("T.float32({cap}) * T.tanh(s / T.float32({cap}))", "T.tanh(s) * T.float32(4.0)"
                                 ).replace("bench_softcap", "bench_tanh4").replace(
    "Soft-capped logits, the cap a constant of the hook body.", "Logits tanh(s) * 4.")


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


def outcome(output: str) -> tuple[str, float]:
    """What the build reported: "cache hit" or "compiled", and its own seconds."""
    for line in output.splitlines():
        for word in ("cache hit", "compiled"):
            if line.startswith(f"attngen: {word} in "):
                return word, float(line.split(" in ", 1)[1].split("s", 1)[0])
    return "", 0.0


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


def bench_arch(arch: str, work: Path, head_dim: int, dtype: str, link: str) -> list[tuple[str, float, str, float]]:
    """One pass of the four builds for ``arch`` into a fresh cache: (row, wall s, outcome, build's own s)."""
    cache = Path(tempfile.mkdtemp(prefix=f"cache-{arch}-", dir=work))
    variant = cache.parent / f"softcap_{cache.name}.py"
    variant.write_text(SOFTCAP_FILE.format(cap="30.0"))
    other = cache.parent / f"tanh4_{cache.name}.py"
    other.write_text(TANH_FILE)
    # "lto-all": a link-time build that links up front the templates its runtime takes only on request too
    build = ["build", "--target", "cuda", "--arch", arch, "--head-dim", str(head_dim), "--dtype", dtype,
             "--link", link.removesuffix("-all")] + (["--link-alternatives"] if link.endswith("-all") else [])
    rows = []
    for name, source, cap in [("cold cache", variant, None), ("cache hit (new process)", variant, None),
                              ("new variant, same hook signature (tanh(s) * 4)", other, None),
                              ("new variant, new signature (causal)", "causal", None),
                              ("one-constant edit (cap 30 -> 31)", variant, "31.0")]:
        if cap is not None:
            variant.write_text(SOFTCAP_FILE.format(cap=cap))
        seconds, out = attngen([build[0], str(source), *build[1:]], cache)
        rows.append((f"{arch}, link {link}: {name}", seconds, *outcome(out)))
        print(f"{rows[-1][0]:48s} {seconds:8.2f} s  {rows[-1][2]} in {rows[-1][3]:.2f} s", flush=True)
    return rows


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_80,sm_90a", help="comma-separated archs (default: sm_80,sm_90a)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--link", default="whole,lto", help="comma-separated build kinds (BuildConfig.link, or lto-all: "
                                                        "lto with --link-alternatives; default: whole,lto)")
    ap.add_argument("--tag", default="", help="suffix of the result file")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="folder of the result file")
    ap.add_argument("--repeat", type=int, default=3, help="passes of every row, each build pass into a fresh "
                                                          "cache (default: 3; the table gives median, min, max)")
    args = ap.parse_args()
    info = machine()
    start = datetime.datetime.now(datetime.timezone.utc)
    runs: dict[str, list[tuple[float, str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        work = Path(tmp)
        for _ in range(args.repeat):
            cli_cache = Path(tempfile.mkdtemp(prefix="cache-cli-", dir=work))
            for label, cmd in [("attngen --help", ["--help"]), ("attngen list (fresh cache)", ["list"]),
                               ("attngen list (again)", ["list"])]:
                seconds, _ = attngen(cmd, cli_cache)
                runs.setdefault(label, []).append((seconds, "", 0.0))
                print(f"{label:48s} {seconds:8.2f} s", flush=True)
            for arch in (a.strip() for a in args.arch.split(",") if a.strip()):
                for link in (x.strip() for x in args.link.split(",") if x.strip()):
                    for name, seconds, what, own in bench_arch(arch, work, args.head_dim, args.dtype, link):
                        runs.setdefault(name, []).append((seconds, what, own))
    minutes = (datetime.datetime.now(datetime.timezone.utc) - start).total_seconds() / 60

    def row(name: str, results: list[tuple[float, str, float]]) -> str:
        wall = [r[0] for r in results]
        what = sorted({r[1] for r in results if r[1]})
        reported = f"{'/'.join(what)}, median {median([r[2] for r in results]):.2f} s" if what else ""
        return f"| {name} | {median(wall):.2f} | {min(wall):.2f} | {max(wall):.2f} | {reported} |"

    lines = [
        f"# attngen build times, {start:%Y-%m-%d %H:%M} UTC",
        "",
        f"Machine: {info['host']}, {info['cores']} cores, {info['cpu']}; {info['os']}; load average at start "
        f"{info['load']}, end {' '.join(f'{x:.2f}' for x in os.getloadavg())} (shared machine: other "
        "processes ran too).",
        f"Commit {info['commit']}; Python {info['python']}; nvcc {info['nvcc']}.",
        "",
        f"Wall seconds of each `attngen` command in a new process (`benchmarks/{Path(sys.argv[0]).name} "
        f"--arch {args.arch} --link {args.link} --repeat {args.repeat}`), CUDA builds of D {args.head_dim}, {args.dtype}, "
        "the default templates (decode, prefill) and layouts (NHD, HND); each pass builds into a fresh cache. "
        f"Median, min and max of {args.repeat} passes; the run took {minutes:.1f} min. \"build\": what the "
        "command reported (a compile or a cache hit, and the build's own seconds, without process start).",
        "",
        "| command | wall s (median) | min | max | build |",
        "|---|---:|---:|---:|---|",
        *[row(name, results) for name, results in runs.items()],
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"build_{start:%Y-%m-%d}_{info['host']}{args.tag}.md"
    path.write_text("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
