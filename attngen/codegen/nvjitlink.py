"""Link LTO-IR objects into a cubin in-process with libnvJitLink (``cuda-bindings`` and the
``nvidia-nvjitlink`` wheel), with link-time optimisation: the hooks' extern device functions are
inlined into the prebuilt templates' kernels. (``nvcc -dlink -dlto`` would do the same through
nvlink, but needs the toolkit's ``nvvm/lib64``, which wheel-assembled toolkits lack.)
"""
from __future__ import annotations

import functools
from pathlib import Path

from . import nvcc


class LinkError(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def _module():
    try:
        from cuda.bindings import nvjitlink
        nvjitlink.version()  # loads libnvJitLink: fails here, not mid-build, when the wheel is missing
    except Exception as e:  # ImportError, or the library's own load error
        raise LinkError("link-time builds need libnvJitLink: pip install 'cuda-bindings>=13' "
                        f"'nvidia-nvjitlink>=13' (or build with link='whole'): {e}") from e
    return nvjitlink


def available() -> bool:
    try:
        _module()
        return True
    except LinkError:
        return False


def version() -> str:
    """libnvJitLink's version, "none" without it (part of the build cache key)."""
    try:
        return ".".join(map(str, _module().version()))
    except LinkError:
        return "none"


def link_cubin(inputs: list[Path], sm: str, fast_math: bool = False, threads: int | None = None,
               ptxas_report: list[str] | None = None) -> bytes:
    """The cubin for ``sm`` (e.g. "80", "90a") of the LTO-IR objects ``inputs`` (nvcc -dc -dlto host
    objects, fatbinaries of relocatable LTO-IR, or bare LTO-IR), optimised and linked as one program;
    ``threads``: the code generator's (default: the build's cores, nvcc.build_cores, at most 8);
    ``ptxas_report``: a list that gets ptxas's report of each kernel's registers, stack frame and spills
    (``-Xptxas=-v``, which changes no code)."""
    nv = _module()
    options = [f"-arch=sm_{sm}", "-lto", "-O3"] + (["-Xptxas=-v"] if ptxas_report is not None else [])
    threads = min(threads or nvcc.build_cores(), 8)
    if threads >= 2:  # kernels code-generated in parallel: the same cubin, bit for bit (4.3 -> 3.4 s on 2 cores)
        options.append(f"-split-compile={threads}")
    if fast_math:  # what nvcc --use_fast_math asks of the code generator
        options += ["-ftz=true", "-prec-div=false", "-prec-sqrt=false", "-fma=true"]
    handle = nv.create(len(options), options)
    try:
        for path in inputs:
            data = Path(path).read_bytes()
            nv.add_data(handle, nv.InputType.ANY, data, len(data), Path(path).name)
        try:
            nv.complete(handle)
        except nv.nvJitLinkError as e:
            raise LinkError(f"nvJitLink failed for sm_{sm}: {e}\n{_log(nv, handle)}") from None
        cubin = bytearray(nv.get_linked_cubin_size(handle))
        nv.get_linked_cubin(handle, cubin)
        if ptxas_report is not None:
            size = nv.get_info_log_size(handle)
            info = bytearray(size)
            if size:
                nv.get_info_log(handle, info)
            ptxas_report.append(bytes(info).decode(errors="replace").rstrip("\x00"))
        return bytes(cubin)
    finally:
        nv.destroy(handle)


def _log(nv, handle) -> str:
    size = nv.get_error_log_size(handle)
    if not size:
        return ""
    buf = bytearray(size)
    nv.get_error_log(handle, buf)
    return bytes(buf).decode(errors="replace").rstrip("\x00")
