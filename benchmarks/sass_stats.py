"""SASS statistics of the Hopper prefill kernel, per source tree, on a machine without a GPU.

Builds the device code of one variant's prefill (``link="check"``: cubins only, sm_90a) from each tree
given, disassembles the cubin with ``nvdisasm`` and counts, in the Hopper prefill kernel, the instructions
that say how its mainloop was scheduled: HGMMA (wgmma), WARPGROUP.DEPBAR (waits for wgmma groups), MUFU
(ex2, tanh, rcp: 16 results per SM and clock), R2UR (register -> uniform register moves; inside the span
of the HGMMAs they mean values the wgmma descriptors or barriers need were not known warp-uniform, and
cost latency per tile), global and shared stores, local-memory traffic, MEMBAR (each fence.proxy.async is a
MEMBAR.ALL.CTA, which waits for the thread's outstanding memory operations). It also compiles the prefill
translation unit once more with ``-Xptxas -v`` and counts ptxas's advisories about the kernel's wgmma pipeline
(C7515: every wgmma serialised, e.g. for a non-wgmma write of an accumulator register while one is in flight;
C7517: a wait injected before a read of registers a wgmma wrote). A change to the kernel can be read here before
it is timed on a GPU.

``nvdisasm`` comes from the CUDA toolkit or the ``nvidia-cuda-nvdisasm`` wheel (``--nvdisasm PATH``).

    python benchmarks/sass_stats.py --tree main=/path/to/a --tree new=/path/to/b [--variant causal]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BUILD = """
import sys
from attngen.codegen.pipeline import run_pipeline
from attngen.schedules.build_config import BuildConfig
from attngen.variants import builtin
cfg = BuildConfig("cuda", ({d},), ("{dtype}",), ("sm_90a",), layouts=("NHD",), kernels=("prefill",), link="check",
                  kv_dtypes=("{kv_dtype}",))
import os, runpy
example = os.path.join("examples", "{variant}.py")  # (an example's variant, else a built-in)
variant = runpy.run_path(example)["variant"] if os.path.exists(example) else builtin("{variant}")
directory = run_pipeline(variant, cfg).directory
# ptxas's wgmma advisories: the prefill TU once more, with the build's own flags and -Xptxas -v
import glob, re, subprocess
from pathlib import Path
from attngen.codegen.cuda_library import _tu_flags
tu = sorted(glob.glob(str(directory) + "/*_prefill.cu"))[0]
log = subprocess.run(["nvcc", "-cubin", "-o", str(Path(directory) / "advisory.cubin"), "-std=c++17", "-O3",
                      "-gencode=arch=compute_90a,code=sm_90a", *_tu_flags(Path(directory), cfg), "-Xptxas", "-v", tu],
                     capture_output=True, text=True)
for line in (log.stdout + log.stderr).splitlines():
    m = re.search(r"\((C75\d\d)\).*function '(\w+)'", line)
    if m:
        print("ADVISORY", m.group(1), m.group(2))
print(directory)
"""
COUNTED = {"HGMMA": r"\bHGMMA\b", "DEPBAR": r"WARPGROUP\.DEPBAR", "R2UR": r"\bR2UR\b", "STG": r"\bSTG\b",
           "STS": r"\bSTS\b", "LDS": r"\bLDS\b", "ST/LD generic": r"\b(ST|LD)\.E",
           "LDL/STL": r"\b(LDL|STL)\b", "BAR": r"\bBAR\.", "MUFU": r"\bMUFU\.", "MEMBAR": r"\bMEMBAR\b"}


def find_nvdisasm(given: str | None) -> str:
    if given:
        return given
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:  # the nvidia-cuda-nvdisasm wheel
        import nvidia

        for base in nvidia.__path__:
            for cand in Path(base).glob("cu*/bin/nvdisasm"):
                return str(cand)
    except ImportError:
        pass
    raise SystemExit("nvdisasm not found: put it on PATH, pass --nvdisasm, or pip install nvidia-cuda-nvdisasm")


def kernel_sass(sass: str, pattern: str) -> dict[str, list[str]]:
    """Function name -> its lines, for each function whose section name matches `pattern` (the non-mapped
    instances by default: one per Hopper tiling the variant has)."""
    out, name = {}, None
    for line in sass.splitlines():
        if line.startswith("//--------------------- .text."):
            m = re.search(r"\.text\.(\S+)", line)
            name = m.group(1) if m and re.search(pattern, line) else None
            if name:
                out[name] = []
        if name:
            out[name].append(line)
    return out


def tiling_label(function: str, head_dim: int) -> str:
    """A short label for a Hopper kernel's tiling: the mangled trailing template bools (Wide, then Split: the
    instance for a plan's tail split) where there are any."""
    from attngen.schedules.template_prefill_hopper import HopperConfig

    m = re.search(r"ES3_Lb([01])E(?:Lb([01])E)?E", function)
    if m is None:
        return ""
    return f" ({HopperConfig(head_dim, m.group(1) == '1').keys} keys{', split' if m.group(2) == '1' else ''})"


def stats(lines: list[str]) -> dict:
    res = {name: sum(1 for ln in lines if re.search(rx, ln)) for name, rx in COUNTED.items()}
    mma = [i for i, ln in enumerate(lines) if "HGMMA" in ln]
    res["R2UR in HGMMA span"] = sum(1 for ln in lines[mma[0]:mma[-1] + 1] if "R2UR" in ln) if mma else 0
    res["instructions"] = sum(1 for ln in lines if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="LABEL=PATH of a tree holding attngen/")
    ap.add_argument("--variant", default="causal", help="a built-in variant, or an example's (examples/NAME.py)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-dtype", help="the K/V cache's type (float8_e4m3fn, float8_e5m2: the fp8 kernels); default "
                                       "the query's")
    ap.add_argument("--kernel", default=r"hopper_prefill_kernel.*Lb0E", help="regex on the function's section name")
    ap.add_argument("--nvdisasm")
    args = ap.parse_args()
    nvdisasm = find_nvdisasm(args.nvdisasm)
    rows = {}
    for spec in args.tree:
        label, _, path = spec.partition("=")
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "PYTHONPATH": str(Path(path).resolve()), "ATTNGEN_CACHE_DIR": cache}
            code = BUILD.format(d=args.head_dim, dtype=args.dtype, variant=args.variant,
                                kv_dtype=args.kv_dtype or args.dtype)
            out = subprocess.run([sys.executable, "-c", code], env=env, cwd=path, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{label}: the build failed:\n{out.stderr[-2000:]}")
            directory = Path(out.stdout.strip().splitlines()[-1])
            advisories = [ln.split()[1:] for ln in out.stdout.splitlines() if ln.startswith("ADVISORY ")]
            cubin = next(directory.glob("*_prefill_sm_90a.cubin"))
            sass = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
        functions = kernel_sass(sass, args.kernel)
        if not functions:
            raise SystemExit(f"{label}: no function matches {args.kernel!r}")
        for function, lines in functions.items():
            row = rows[label + tiling_label(function, args.head_dim)] = stats(lines)
            row["ptxas wgmma advisories"] = " ".join(sorted({code for code, fn in advisories
                                                             if fn in function or function in fn})) or "none"
    keys = list(next(iter(rows.values())))
    kv = f" ({args.kv_dtype} K/V)" if args.kv_dtype and args.kv_dtype != args.dtype else ""
    print(f"{args.variant}, D {args.head_dim}, {args.dtype}{kv}, sm_90a; kernel /{args.kernel}/\n")
    print("| tree | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for label, r in rows.items():
        print(f"| {label} | " + " | ".join(str(r[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
