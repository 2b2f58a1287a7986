"""Build host-only C++ libraries exporting TVM-FFI functions (the split-KV planner) with the system C++ compiler."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import attngen

from .cache import BuildCache, content_key, hash_files

CSRC = Path(attngen.__file__).parent / "csrc"
PLANNER_SOURCES = ("planner.h", "planner_ffi.cc")


@functools.lru_cache(maxsize=None)
def _cxx() -> tuple[str, str]:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        raise RuntimeError("no C++ compiler found: install g++ or set CXX")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return cxx, version


def build_planner_library(cache: BuildCache | None = None) -> Path:
    """``libattngen_planner.so`` for this machine, from the build cache when the sources are unchanged."""
    import tvm_ffi.libinfo as li

    cxx, version = _cxx()
    cache = cache or BuildCache()
    key = content_key({"planner": hash_files([CSRC / s for s in PLANNER_SOURCES]), "cxx": version,
                       "attngen": attngen.__version__})
    ffi_lib = Path(li.find_libtvm_ffi())

    def build(out: Path) -> None:
        cmd = [cxx, "-std=c++17", "-O2", "-shared", "-fPIC", f"-I{li.find_include_path()}",
               f"-I{li.find_dlpack_include_path()}", str(CSRC / "planner_ffi.cc"), "-o",
               str(out / "libattngen_planner.so"), f"-L{ffi_lib.parent}", "-ltvm_ffi", f"-Wl,-rpath,{ffi_lib.parent}"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"planner build failed:\n$ {' '.join(cmd)}\n{p.stderr}")

    directory, _ = cache.get_or_build(key, build)
    return directory / "libattngen_planner.so"
