"""Find and drive nvcc: version, per-arch compiles, parallel jobs, readable failures."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .cache import ABSENT


class NvccError(RuntimeError):
    pass


# environment variables nvcc reads that change what it makes: every cache key of an nvcc output holds them
COMPILER_ENV = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")


def compiler_env() -> dict[str, str]:
    """The set ones of :data:`COMPILER_ENV`."""
    return {name: os.environ[name] for name in COMPILER_ENV if name in os.environ}


# where the nvidia-cuda-nvcc wheel puts nvcc under a site-packages directory (CUDA 13, then CUDA 12 wheels)
WHEEL_NVCC_DIRS = ("nvidia/cu13/bin", "nvidia/cuda_nvcc/bin")


def wheel_nvcc_candidates() -> list[str]:
    """nvcc of an nvidia-cuda-nvcc wheel in any ``sys.path`` directory (``pip install nvidia-cuda-nvcc``)."""
    return [str(Path(entry) / d / "nvcc") for entry in sys.path if entry for d in WHEEL_NVCC_DIRS]


DEFAULT_CUDA_HOME = "/usr/local/cuda"


@functools.lru_cache(maxsize=None)
def find_nvcc() -> str | None:
    """ATTNGEN_NVCC, then PATH, then CUDA_HOME/bin (or CUDA_PATH), then /usr/local/cuda/bin, then an
    nvidia-cuda-nvcc wheel's (last: a wheel another package pulled in must not hide a whole toolkit)."""
    cands = [os.environ.get("ATTNGEN_NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), DEFAULT_CUDA_HOME):
        if home:
            cands.append(str(Path(home) / "bin" / "nvcc"))
    cands += wheel_nvcc_candidates()
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
        return ABSENT
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


@functools.lru_cache(maxsize=None)
def _dry_run() -> str:
    """What nvcc would run for an empty CUDA file (nvcc may be a wrapper script: its real toolkit's directories
    are read from here)."""
    return subprocess.run([require_nvcc(), "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                          capture_output=True, text=True).stderr


@functools.lru_cache(maxsize=None)
def cuda_include_dirs() -> tuple[Path, ...]:
    """The CUDA toolkit's header directories, as nvcc names them."""
    m = re.search(r'INCLUDES="([^"]*)"', _dry_run())
    return tuple(Path(d) for d in re.findall(r"-I(\S+)", m.group(1).replace('"', ""))) if m else ()


@functools.lru_cache(maxsize=None)
def cudart_static() -> Path:
    """The CUDA runtime's static archive of the toolkit nvcc belongs to."""
    out = _dry_run()
    dirs = [Path(d) for d in re.findall(r'"-L([^"]+)"', out)]
    tops = [Path(t.strip()) for t in re.findall(r"TOP=(.+)", out)]
    dirs += [t / sub for t in tops for sub in ("lib64", "lib", "targets/x86_64-linux/lib")]
    for d in dirs:
        if (d / "libcudart_static.a").is_file():
            return (d / "libcudart_static.a").resolve()
    raise RuntimeError(f"libcudart_static.a not found in nvcc's library directories {[str(d) for d in dirs]}: "
                       "the CUDA toolkit's static runtime is needed to link attngen's kernels into a library")


def run_tool(cmd: list[str], what: str) -> None:
    """Run one compiler or linker command; its diagnostics in the error when it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise NvccError(f"{what} failed:\n$ {' '.join(cmd)}\n{p.stderr[-6000:]}")


@dataclass(frozen=True)
class NvccJob:
    source: Path
    output: Path
    gencode: str
    flags: tuple[str, ...] = ()
    mode: str = "-c"  # or "-cubin": the device code alone, for one arch

    def command(self, nvcc: str, cores: int = 1) -> list[str]:
        """The nvcc command, using up to ``cores`` threads (:func:`thread_flags`)."""
        return [nvcc, "-std=c++17", "-O3", self.gencode, *self.flags, *thread_flags(self, cores), self.mode,
                str(self.source), "-o", str(self.output)]

    @property
    def arch_count(self) -> int:
        return 1 + sum(f.startswith("-gencode") for f in self.flags)


def build_cores() -> int:
    """The cores a build may keep busy: ``ATTNGEN_BUILD_CORES``, else the machine's (a test runner with several
    workers gives each its share). It changes how fast a build runs, never what it makes: no cache key holds it."""
    value = os.environ.get("ATTNGEN_BUILD_CORES")
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            raise NvccError(f"ATTNGEN_BUILD_CORES={value!r}: give a whole number of cores") from None
    return os.cpu_count() or 1


def thread_flags(job: NvccJob, cores: int) -> tuple[str, ...]:
    """nvcc's own parallelism for a job given ``cores``: its archs side by side (``--threads``), then each
    arch's kernels optimised and code-generated side by side (``--split-compile``). Neither changes the
    code: the kernels' .text sections are byte for byte those of a serial compile (tests/test_cuda_codegen.py),
    so neither enters a cache key; a build on a 16-core machine finishes its few translation units in a
    fraction of the time, one on 2 cores with 2 units compiles as before."""
    threads = max(1, min(job.arch_count, cores))
    split = cores // threads
    return ((f"--threads={threads}",) if threads > 1 else ()) + ((f"--split-compile={split}",) if split > 1 else ())


def run_jobs(jobs: list[NvccJob], parallel: int | None = None) -> None:
    """Compile every job (the machine's cores shared among them); raise one NvccError listing each failing
    command and its diagnostics."""
    nvcc = require_nvcc()
    cores = build_cores()
    workers = parallel or max(1, min(len(jobs), cores))
    per_job = max(1, cores // max(1, len(jobs)))

    def run(job: NvccJob):
        cmd = job.command(nvcc, per_job)
        p = subprocess.run(cmd, capture_output=True, text=True)
        return job, cmd, p

    failures = []
    with ThreadPoolExecutor(workers) as pool:
        for job, cmd, p in pool.map(run, jobs):
            if p.returncode != 0:
                failures.append(f"$ {' '.join(cmd)}\n{p.stderr.strip()}")
    if failures:
        raise NvccError("nvcc failed:\n" + "\n\n".join(failures))
