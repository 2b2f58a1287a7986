"""Target backends of the staged build, one object per ``BuildConfig.target``."""
from __future__ import annotations

from .base import Backend, BuildContext
from .cpu import CPUBackend
from .cuda import CUDABackend

BACKENDS: dict[str, Backend] = {b.target: b for b in (CPUBackend(), CUDABackend())}

__all__ = ["BACKENDS", "Backend", "BuildContext", "backend_for"]


def backend_for(target: str) -> Backend:
    if target not in BACKENDS:
        raise KeyError(f"no backend for target {target!r}; known: {sorted(BACKENDS)}")
    return BACKENDS[target]
