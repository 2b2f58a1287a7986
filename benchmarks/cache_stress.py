"""Build-cache stress: rounds of concurrent CPU builds into one fresh cache directory, one build SIGKILLed
mid-compile each round, then every process's result checked against the float64 reference.

Each round starts ``--procs`` processes (tests/cache_safety_worker.py: build a built-in variant for the CPU,
run it, compare with the reference), several on the same variant and some on different ones; one of
them is killed as soon as a build's temporary directory appears. After each round: every entry on disk
passes its seal, no temporary directory is left once the next build of its key has run, and a last
round in fresh processes serves every variant from the cache and runs it correctly. Figures go to
benchmarks/results/cache_stress.json.

    PYTHONPATH=. python benchmarks/cache_stress.py --rounds 3 --procs 4
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attngen.codegen.cache import entry_is_sealed  # noqa: E402

VARIANTS = ("vanilla", "causal", "alibi", "logits_softcap", "sliding_window_causal", "rope", "sigmoid",
            "attention_sink", "custom_mask")


def start(name: str, cache_dir: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "cache_safety_worker.py"), name, str(cache_dir)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def temporaries(cache_dir: Path) -> list[Path]:
    return [p for p in cache_dir.glob("*/.*") if p.is_dir()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cache_stress.json"))
    args = ap.parse_args(argv)
    cache_dir = Path(tempfile.mkdtemp(prefix="attngen-cache-stress-"))
    figures = {"processes": 0, "killed_mid_build": 0, "compiler_runs": 0, "served_from_cache": 0,
               "results_checked": 0, "wrong_results": 0, "crashed": 0, "unsealed_entries_seen": 0,
               "temporaries_left_after_rebuild": 0}
    t0 = time.time()
    built_names = set()
    for r in range(args.rounds):
        # the killed build's variant is one not built yet, built again by two of the others in the same round
        fresh = [n for n in VARIANTS if n not in built_names] or list(VARIANTS)
        victim_name = fresh[0]
        victim = start(victim_name, cache_dir)
        figures["processes"] += 1
        while not list(cache_dir.glob(f"*/.*-{victim.pid}-*")) and victim.poll() is None:
            time.sleep(0.02)
        if victim.poll() is None:
            victim.send_signal(signal.SIGKILL)
            figures["killed_mid_build"] += 1
        victim.communicate()
        others = (fresh[1:] + list(VARIANTS))[:args.procs - 2]
        names = [victim_name, victim_name] + others
        built_names.update(names)
        procs = [start(n, cache_dir) for n in names]
        figures["processes"] += len(procs)
        for p in procs:
            out, err = p.communicate(timeout=900)
            if p.returncode != 0:
                figures["crashed"] += 1
                print(err[-2000:], file=sys.stderr)
                continue
            res = json.loads(out.strip().splitlines()[-1])
            figures["results_checked"] += 1
            figures["compiler_runs"] += res["builds"]
            figures["served_from_cache"] += res["builds"] == 0
            figures["wrong_results"] += res["err"] > 1e-4
        entries = [p for p in cache_dir.glob("*/*") if p.is_dir() and not p.name.startswith(".")]
        figures["unsealed_entries_seen"] += sum(not entry_is_sealed(p) for p in entries)
        figures["temporaries_left_after_rebuild"] += len(temporaries(cache_dir))
        print(f"round {r + 1}: {figures}", flush=True)
    final = [start(n, cache_dir) for n in sorted(built_names)]
    figures["processes"] += len(final)
    served = []
    for p in final:
        out, err = p.communicate(timeout=900)
        res = json.loads(out.strip().splitlines()[-1]) if p.returncode == 0 else {"builds": -1, "err": 1.0}
        served.append(res["builds"] == 0 and res["err"] < 1e-4)
    figures["final_round_processes"] = len(final)
    figures["final_round_all_served_and_correct"] = all(served)
    report = {"command": "benchmarks/cache_stress.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": platform.platform(), "cpus": os.cpu_count(), "seconds": round(time.time() - t0, 1),
              **figures}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    bad = figures["crashed"] or figures["wrong_results"] or figures["unsealed_entries_seen"] or \
        figures["temporaries_left_after_rebuild"] or not figures["final_round_all_served_and_correct"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
