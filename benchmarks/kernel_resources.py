"""Registers, stack frame and spills of every kernel of a variant, whole-program against linked (no GPU).

ptxas reports what each kernel uses (``-v``): registers per thread, bytes of stack frame, bytes spilled to and
reloaded from local memory. This script builds one variant for one arch both ways and asks ptxas each time:

- whole-program: the build's translation units (``link="check"`` writes the same sources a whole build
  compiles), each compiled again for the arch with ``nvcc -cubin -Xptxas -v`` and the build's own flags;
- linked (``link="lto"``, every part linked up front): each cubin's nvJitLink link run with ``-Xptxas=-v``
  (the link the build makes, asked to report), its info log read.

Kernels are named by their key (``hopper_prefill_kernel<__nv_bfloat16, 128, false, __nv_bfloat16>``, as
codegen/linked_cubin.py spells it). Writes ``<out>/kernel_resources_<date>_<variant>_<arch>.md``.

    python benchmarks/kernel_resources.py --variant logits_softcap --arch sm_90a
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import git_commit, write_results  # noqa: E402

ENTRY = re.compile(r"(?:Compiling entry function|Function properties for) '?(_Z\w+)'?")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas(log: str) -> dict[str, dict]:
    """mangled kernel name -> {"regs", "frame", "spill_stores", "spill_loads"} from ptxas -v output."""
    out, current = {}, None
    for line in log.splitlines():
        m = ENTRY.search(line)
        if m:
            current = out.setdefault(m.group(1), {})
        if current is None:
            continue
        if (m := FRAME.search(line)):
            current.update(frame=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        if (m := REGS.search(line)):
            current["regs"] = int(m.group(1))
    return {k: v for k, v in out.items() if "regs" in v}


def by_key(found: dict[str, dict]) -> dict[str, dict]:
    from attngen.codegen.linked_cubin import kernel_table

    table = kernel_table(sorted(found))
    return {key: found[mangled] for key, mangled in table.items()}


def whole_resources(variant, cfg, cache) -> dict[str, dict]:
    from attngen.codegen import nvcc
    from attngen.codegen.cuda_library import _tu_flags
    from attngen.codegen.pipeline import run_pipeline
    from attngen.schedules.arch import arch_spec

    res = run_pipeline(variant, dataclasses.replace(cfg, link="check"), cache=cache)
    found = {}
    for tu in sorted(res.directory.glob("*.cu")):
        with tempfile.TemporaryDirectory() as tmp:
            job = nvcc.NvccJob(tu, Path(tmp) / "x.cubin", arch_spec(cfg.archs[0]).gencode,
                               (*_tu_flags(res.directory, cfg), "-Xptxas", "-v"), mode="-cubin")
            p = subprocess.run(job.command(nvcc.require_nvcc()), capture_output=True, text=True, check=True)
        found.update(parse_ptxas(p.stderr))
    return by_key(found)


def linked_resources(variant, cfg, cache) -> dict[str, dict]:
    from attngen.codegen import nvjitlink
    from attngen.codegen.pipeline import run_pipeline

    reports = []
    plain = nvjitlink.link_cubin

    def reporting_link(*args, **kwargs):  # the build's own links, each asked for ptxas's report
        return plain(*args, **kwargs, ptxas_report=reports)

    nvjitlink.link_cubin = reporting_link
    try:
        run_pipeline(variant, dataclasses.replace(cfg, link="lto", defer_alternatives=False), cache=cache)
    finally:
        nvjitlink.link_cubin = plain
    found = {}
    for log in reports:
        found.update(parse_ptxas(log))
    return by_key(found)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="logits_softcap")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()

    from attngen.codegen.cache import BuildCache
    from attngen.schedules import BuildConfig
    from attngen.variants import builtin

    variant = builtin(args.variant)
    cfg = BuildConfig("cuda", (args.head_dim,), (args.dtype,), (args.arch,))
    cache = BuildCache(tempfile.mkdtemp(prefix="kernel_resources_"))
    whole, linked = whole_resources(variant, cfg, cache), linked_resources(variant, cfg, cache)

    def cell(r):
        if r is None:
            return "—"
        return f"{r['regs']} / {r['frame']} / {r['spill_stores']} / {r['spill_loads']}"

    commit = git_commit()
    lines = [f"# Kernel resources, whole-program against linked — {args.variant}, D {args.head_dim}, {args.dtype}, "
             f"{args.arch} ({datetime.date.today().isoformat()}, {commit})", "",
             "`python benchmarks/kernel_resources.py` (ptxas -v through nvcc and through nvJitLink). Each cell: "
             "registers / stack frame bytes / spill store bytes / spill load bytes.", "",
             "| kernel | whole-program | linked | same |", "|---|---|---|---|"]
    for key in sorted(set(whole) | set(linked)):
        w, lk = whole.get(key), linked.get(key)
        lines.append(f"| `{key}` | {cell(w)} | {cell(lk)} | {'yes' if w == lk else 'no'} |")
    stem = f"kernel_resources_{datetime.date.today().isoformat()}_{args.variant}_{args.arch}"
    write_results(args.out, stem, {"commit": commit, "variant": args.variant, "arch": args.arch,
                                   "head_dim": args.head_dim, "dtype": args.dtype, "whole": whole,
                                   "linked": linked}, lines)


if __name__ == "__main__":
    main()
