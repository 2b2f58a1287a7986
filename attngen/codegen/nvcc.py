"""Find and drive nvcc: version, per-arch compiles, parallel jobs, readable failures."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path


class NvccError(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def find_nvcc() -> str | None:
    """ATTNGEN_NVCC, then PATH, then CUDA_HOME/bin, then /usr/local/cuda/bin."""
    cands = [os.environ.get("ATTNGEN_NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            cands.append(str(Path(home) / "bin" / "nvcc"))
    for c in cands:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


def require_nvcc() -> str:
    nvcc = find_nvcc()
    if nvcc is None:
        raise NvccError("nvcc not found: install the CUDA toolkit (or the nvidia-cuda-nvcc wheel) "
                        "and put nvcc on PATH, or set ATTNGEN_NVCC=/path/to/nvcc")
    return nvcc


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    nvcc = find_nvcc()
    if nvcc is None:
        return "none"
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


@dataclass(frozen=True)
class NvccJob:
    source: Path
    output: Path
    gencode: str
    flags: tuple[str, ...] = ()
    mode: str = "-c"  # or "-cubin": the device code alone, for one arch

    def command(self, nvcc: str) -> list[str]:
        return [nvcc, "-std=c++17", "-O3", self.gencode, *self.flags, self.mode, str(self.source),
                "-o", str(self.output)]


def run_jobs(jobs: list[NvccJob], parallel: int | None = None) -> None:
    """Compile every job; raise one NvccError listing each failing command and its diagnostics."""
    nvcc = require_nvcc()
    workers = parallel or max(1, min(len(jobs), os.cpu_count() or 1))

    def run(job: NvccJob):
        cmd = job.command(nvcc)
        p = subprocess.run(cmd, capture_output=True, text=True)
        return job, cmd, p

    failures = []
    with ThreadPoolExecutor(workers) as pool:
        for job, cmd, p in pool.map(run, jobs):
            if p.returncode != 0:
                failures.append(f"$ {' '.join(cmd)}\n{p.stderr.strip()}")
    if failures:
        raise NvccError("nvcc failed:\n" + "\n\n".join(failures))
