"""The one entry point through which the runtime and the user build: a variant's library (the staged
pipeline of :mod:`attngen.codegen.pipeline`) and the variant-independent support libraries (the
host split-KV planner, the CPU and CUDA state-merge kernels). The runtime loads what these return
and builds nothing itself. (``attngen.tvm``, above the runtime, also builds the pieces only a TVM
model needs, its CPU slot kernels and its relocatable CUDA object, from the code generators.)
"""
from __future__ import annotations

from pathlib import Path

from attngen.codegen.host_library import build_merge_cuda_library, build_planner_library
from attngen.codegen.pipeline import BuildResult, run_pipeline
from attngen.schedules.build_config import BuildConfig

SUPPORT_LIBRARIES = ("planner", "merge_cpu", "merge_cuda")


def build(variant, config: BuildConfig, **kwargs) -> BuildResult:
    """Build ``variant`` for ``config`` (cached by content); ``kwargs``: ``cache``, ``dump``, ``log``."""
    return run_pipeline(variant, config, **kwargs)


def support_library(kind: str, *, archs: tuple[str, ...] = (), cache=None) -> Path:
    """The shared library of one variant-independent piece, from the build cache when its sources are
    unchanged: "planner" (host C++), "merge_cpu" (TIR by LLVM), "merge_cuda" (for ``archs``)."""
    if kind == "planner":
        return build_planner_library(cache)
    if kind == "merge_cpu":
        from attngen.codegen.cpu.merge_tir import build_merge_library  # TIR: imports TVM

        return build_merge_library(cache)
    if kind == "merge_cuda":
        return build_merge_cuda_library(tuple(archs), cache)
    raise ValueError(f"unknown support library {kind!r}; known: {list(SUPPORT_LIBRARIES)}")
