"""Compile a small CUDA source to LTO-IR in-process with NVRTC (``cuda-bindings`` and the
``nvidia-cuda-nvrtc`` wheel): the hook objects of link-time builds, without an nvcc process."""
from __future__ import annotations

import functools
from pathlib import Path


class NvrtcError(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def _module():
    try:
        from cuda.bindings import nvrtc
        err, _, _ = nvrtc.nvrtcVersion()
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(f"nvrtcVersion: {err}")
    except Exception as e:
        raise NvrtcError("NVRTC is not available (pip install 'cuda-bindings>=13' 'nvidia-cuda-nvrtc>=13'): "
                         f"{e}") from e
    return nvrtc


def available() -> bool:
    try:
        _module()
        return True
    except NvrtcError:
        return False


def version() -> str:
    try:
        _, major, minor = _module().nvrtcVersion()
        return f"{major}.{minor}"
    except NvrtcError:
        return "none"


def _check(nv, result, prog=None, what=""):
    err = result[0] if isinstance(result, tuple) else result
    if err != nv.nvrtcResult.NVRTC_SUCCESS:
        log = ""
        if prog is not None:
            _, size = nv.nvrtcGetProgramLogSize(prog)
            buf = b" " * size
            nv.nvrtcGetProgramLog(prog, buf)
            log = buf.decode(errors="replace")
        raise NvrtcError(f"NVRTC {what} failed ({err}):\n{log}")
    return result[1:] if isinstance(result, tuple) else None


# NVRTC has no C library headers; the generated hooks include <stdint.h> for these names only.
STDINT_H = """#pragma once
typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long long uint64_t; typedef long long intptr_t; typedef unsigned long long uintptr_t;
"""


def compile_ltoir(source: str, name: str, sm: str, include_dirs: list[Path], fast_math: bool) -> bytes:
    """LTO-IR of ``source`` for ``sm`` (e.g. "80"), relocatable (its extern functions link later).
    ``include_dirs`` must hold the CUDA headers (cuda_fp16.h ...), e.g. the toolkit's include directory."""
    nv = _module()
    (prog,) = _check(nv, nv.nvrtcCreateProgram(source.encode(), name.encode(), 1, [STDINT_H.encode()],
                                               [b"stdint.h"]), what="create")
    try:
        opts = [f"-arch=sm_{sm}", "-dlto", "-rdc=true", "-std=c++17", "-default-device",
                *(f"-I{d}" for d in include_dirs), *(("--use_fast_math",) if fast_math else ())]
        _check(nv, nv.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts]), prog, "compile")
        (size,) = _check(nv, nv.nvrtcGetLTOIRSize(prog), what="LTO-IR size")
        buf = b" " * size
        _check(nv, nv.nvrtcGetLTOIR(prog, buf), what="LTO-IR")
        return buf
    finally:
        nv.nvrtcDestroyProgram(prog)
