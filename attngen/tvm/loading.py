"""Built libraries loaded once per process (a cache's kernels are looked up from them by name)."""
from __future__ import annotations

import functools
from pathlib import Path


@functools.lru_cache(maxsize=None)
def _load(path: str):
    import tvm_ffi

    return tvm_ffi.load_module(path)


def load_library(path: str | Path):
    """The TVM-FFI module of the shared library at ``path``, loaded on first use."""
    return _load(str(path))
