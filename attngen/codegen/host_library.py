"""Variant-independent libraries exporting TVM-FFI functions: the split-KV planner (host C++,
built with the system C++ compiler) and the CUDA state-merge kernels (built with nvcc)."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import attngen

from . import nvcc
from .cache import ABSENT, BuildCache, content_key, hash_files, package_version

CSRC = Path(attngen.__file__).parent / "csrc"


@functools.lru_cache(maxsize=None)
def csrc_hash() -> str:
    """The digest of every file in attngen/csrc: the key part of a build compiling any of them (a header
    one includes may include others, so the whole directory is hashed)."""
    return hash_files(sorted(p for p in CSRC.iterdir() if p.is_file()), root=CSRC)


@functools.lru_cache(maxsize=None)
def host_cxx() -> tuple[str, str]:
    """(the host C++ compiler, its version line): what builds the planner and what nvcc and TVM link with."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        raise RuntimeError("no C++ compiler found: install g++ or set CXX")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return cxx, version


def host_cxx_version() -> str:
    """The host C++ compiler's version line (:func:`host_cxx`), ABSENT where there is none."""
    try:
        return host_cxx()[1]
    except (RuntimeError, OSError, IndexError):  # (none found; CXX naming no program; no version line)
        return ABSENT


def nvcc_key(flags) -> dict:
    """What of an nvcc command a cache key holds beside its sources: its flags (directories left out or as
    placeholders, so that a cache built elsewhere serves here), nvcc's version, the environment variables nvcc
    reads (nvcc.COMPILER_ENV) and the host compiler, which preprocesses even a device-only compile."""
    return {"flags": list(flags), "nvcc": nvcc.nvcc_version(), "compiler_env": nvcc.compiler_env(),
            "host_cxx": host_cxx_version()}


def build_planner_library(cache: BuildCache | None = None) -> Path:
    """``libattngen_planner.so`` for this machine, from the build cache when the sources are unchanged."""
    import tvm_ffi.libinfo as li

    version = host_cxx_version()
    cache = cache or BuildCache()
    sources = {"planner": csrc_hash(), "attngen": attngen.__version__}
    ffi_lib = Path(li.find_libtvm_ffi())

    def build(out: Path) -> None:
        nvcc.run_tool([host_cxx()[0], "-std=c++17", "-O2", "-shared", "-fPIC", f"-I{li.find_include_path()}",
                       f"-I{li.find_dlpack_include_path()}", str(CSRC / "planner_ffi.cc"), "-o",
                       str(out / "libattngen_planner.so"), f"-L{ffi_lib.parent}", "-ltvm_ffi",
                       f"-Wl,-rpath,{ffi_lib.parent}"], "planner build")

    directory, _ = cache.get_or_build_with_tools(content_key({**sources, "cxx": version}), build,
                                                 stand_in=content_key({**sources, "stand_in": "planner"}),
                                                 tools={"host C++ compiler": version}, what="the split-KV planner")
    return directory / "libattngen_planner.so"


def merge_object(gencodes: list[str], cache: BuildCache) -> Path:
    """The state-merge kernels and their exports (csrc/merge_states.cu) as one -fPIC object for ``gencodes``:
    the merge library links it, and so does every variant's TVM slot object."""
    import tvm_ffi.libinfo as li

    flags = ("-std=c++17", "-O3", "-c", "-Xcompiler", "-fPIC", *gencodes)
    key = content_key({"merge_object": csrc_hash(), "tvm_ffi": package_version("apache-tvm-ffi"),
                       "attngen": attngen.__version__, **nvcc_key(flags)})

    def build(out: Path) -> None:
        nvcc.run_tool([nvcc.require_nvcc(), *flags, f"-I{CSRC}", f"-I{li.find_include_path()}",
                       f"-I{li.find_dlpack_include_path()}", str(CSRC / "merge_states.cu"), "-o",
                       str(out / "merge_states.o")], "nvcc of the merge kernels")

    directory, _ = cache.get_or_build(key, build)
    return directory / "merge_states.o"


def build_merge_cuda_library(archs: tuple[str, ...], cache: BuildCache | None = None) -> Path:
    """``libattngen_merge_cuda.so``: merge_state_inplace / merge_states / merge_states_sum for the archs."""
    import tvm_ffi.libinfo as li

    from attngen.schedules.arch import arch_spec

    cache = cache or BuildCache()
    gencodes = [arch_spec(a).gencode for a in archs]
    sources = {"merge_cuda": csrc_hash(), "archs": gencodes, "attngen": attngen.__version__}
    tools = {"nvcc": nvcc.nvcc_version(), "host C++ compiler": host_cxx_version()}
    ffi_lib = Path(li.find_libtvm_ffi())

    def build(out: Path) -> None:
        nvcc.run_tool([nvcc.require_nvcc(), "-shared", "-cudart", "static", *gencodes, "-o",
                       str(out / "libattngen_merge_cuda.so"), str(merge_object(gencodes, cache)),
                       f"-L{ffi_lib.parent}", "-ltvm_ffi", f"-Xlinker=-rpath={ffi_lib.parent}"],
                      "the link of the merge library")

    directory, _ = cache.get_or_build_with_tools(content_key({**sources, "nvcc": tools["nvcc"]}), build,
                                                 stand_in=content_key({**sources, "stand_in": "merge_cuda"}),
                                                 tools=tools, what="the CUDA state-merge library")
    return directory / "libattngen_merge_cuda.so"
