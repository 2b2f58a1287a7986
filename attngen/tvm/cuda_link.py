"""Compiling and linking a CUDA model library that holds attngen's object file (no GPU needed).

``tvm.compile`` builds the model's own CUDA kernels with nvcc and without fast math (TVM's split +
RoPE kernel then uses precise sin / cos, as attngen's kernels do); the export links attngen's
object in with the shared C++ runtime named explicitly, since the object needs libstdc++ symbols
(exceptions, operator new) and a toolchain whose own library directory holds only a non-PIC
``libstdc++.a`` would otherwise link that archive and fail ("relocation ... can not be used when
making a shared object").
"""
from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path


def export_cuda_model_library(mod, path: str | Path, arch: str) -> Path:
    """Compile a model IRModule holding attngen's CUDA object for ``arch`` and export it as a shared library."""
    import tvm
    from tvm.target import Target

    path = Path(path)
    target = Target({"kind": "cuda", "arch": arch}, host={"kind": "llvm"})
    with _tvm_nvcc_precise(), target:
        executable = tvm.compile(mod, target=target)
    executable.export_library(str(path), fcompile=create_shared_with_libstdcxx)
    return path


def create_shared_with_libstdcxx(output: str, objects: list[str], **kwargs) -> None:
    """TVM's shared-library link with the shared C++ runtime named after the objects: after them, it satisfies
    their references even under ``--as-needed``."""
    from tvm.support import cc

    cc.create_shared(output, list(objects) + libstdcxx_shared(), **kwargs)


def libstdcxx_shared() -> list[str]:
    """The shared C++ runtime to link: the one loaded in this process (the model will run with it), else the
    compiler's ``libstdc++.so``; empty when neither is found (the compiler's default then applies)."""
    try:
        with open("/proc/self/maps") as maps:
            loaded = sorted({line.split()[-1] for line in maps if "/libstdc++.so" in line})
    except OSError:
        loaded = []
    for lib in loaded:
        if os.path.isfile(lib):
            return [lib]
    from tvm.support import cc

    found = subprocess.run([cc.get_cc() or "g++", "-print-file-name=libstdc++.so"], capture_output=True, text=True)
    lib = found.stdout.strip()
    return [lib] if found.returncode == 0 and os.path.isabs(lib) and os.path.isfile(lib) else []


@contextlib.contextmanager
def _tvm_nvcc_precise():
    """TVM compiles the model's own CUDA kernels with nvcc (a fatbin, on any machine: its default NVRTC path
    needs the CUDA driver) and without --use_fast_math."""
    keys = {"TVM_CUDA_COMPILE_MODE": "nvcc", "TVM_CUDA_NVCC_NO_FAST_MATH": "1"}
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
