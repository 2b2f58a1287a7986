"""One relocatable object file of attngen's TVM PagedKVCache functions, for static linking into a
TVM model library (the way TVM links FlashInfer: object files exporting TVM-FFI functions).

The object holds a variant's TVM-slot translation unit (``kernels=("tvm",)``: both slot
conventions), attngen's state-merge kernels and the CUDA runtime (static), joined by ``ld -r``.
Every symbol is then made local except the TVM-FFI exports, renamed ``__tvm_ffi_<prefix>_<name>``
(and tvm-ffi's own weak template symbols, which the model library shares with libtvm_ffi), so
two objects with different prefixes, or the model's own CUDA code, never collide.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import attngen

from . import nvcc
from .cache import BuildCache, content_key, hash_files
from .host_library import csrc_hash

CSRC = Path(attngen.__file__).parent / "csrc"
OBJECT_NAME = "attngen_tvm_slots.o"


def cudart_static() -> Path:
    """The CUDA runtime's static archive of the toolkit nvcc belongs to (nvcc may be a wrapper script, so its
    library directories are read from a dry run)."""
    import os
    import re

    out = subprocess.run([nvcc.require_nvcc(), "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True).stderr
    dirs = [Path(d) for d in re.findall(r'"-L([^"]+)"', out)]
    tops = [Path(t.strip()) for t in re.findall(r"TOP=(.+)", out)]
    dirs += [t / sub for t in tops for sub in ("lib64", "lib", "targets/x86_64-linux/lib")]
    for d in dirs:
        if (d / "libcudart_static.a").is_file():
            return (d / "libcudart_static.a").resolve()
    raise RuntimeError(f"libcudart_static.a not found in nvcc's library directories {[str(d) for d in dirs]}: "
                       "the CUDA toolkit's static runtime is needed to link attngen's kernels into a model library")


def _run(cmd: list[str], what: str) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{what} failed:\n$ {' '.join(cmd)}\n{p.stderr[-4000:]}")


def merge_object(gencodes: list[str], cache: BuildCache) -> Path:
    """The state-merge kernels and their exports (csrc/merge_states.cu) as one -fPIC object for ``gencodes``,
    cached apart from the slot objects that link it (every variant's slot object has the same one)."""
    import tvm_ffi.libinfo as li

    key = content_key({"merge_object": csrc_hash(), "gencodes": gencodes, "nvcc": nvcc.nvcc_version(),
                       "attngen": attngen.__version__})

    def build(out: Path) -> None:
        _run([nvcc.require_nvcc(), "-std=c++17", "-O3", "-c", "-Xcompiler", "-fPIC", *gencodes, f"-I{CSRC}",
              f"-I{li.find_include_path()}", f"-I{li.find_dlpack_include_path()}", str(CSRC / "merge_states.cu"),
              "-o", str(out / "merge_states.o")], "nvcc of the merge kernels")

    directory, _ = cache.get_or_build(key, build)
    return directory / "merge_states.o"


def build_slot_object(objects: list[Path], exports: list[str], *, gencodes: list[str], prefix: str,
                      cache: BuildCache | None = None) -> Path:
    """Join ``objects`` (nvcc -fPIC objects of TVM-slot TUs), the merge kernels and the static CUDA runtime
    into one object whose only global functions are ``__tvm_ffi_<prefix>_<e>`` for ``e`` in ``exports``."""
    if not prefix.isidentifier():
        raise ValueError(f"name_prefix {prefix!r}: must be a C identifier")
    cache = cache or BuildCache()
    key = content_key({"slot_object": hash_files(objects), "merge": csrc_hash(),
                       "exports": sorted(exports), "prefix": prefix, "gencodes": gencodes,
                       "nvcc": nvcc.nvcc_version(), "attngen": attngen.__version__})

    def build(out: Path) -> None:
        merge = merge_object(gencodes, cache)
        joined = out / "joined.o"
        _run(["ld", "-r", "-o", str(joined), *map(str, objects), str(merge), str(cudart_static())],
             "ld -r of the slot objects")
        renames = out / "renames.txt"
        renames.write_text("".join(f"__tvm_ffi_{e} __tvm_ffi_{prefix}_{e}\n" for e in exports))
        _run(["objcopy", f"--redefine-syms={renames}", "--wildcard", f"--keep-global-symbol=__tvm_ffi_{prefix}_*",
              "--keep-global-symbol=_ZN3tvm3ffi*", "--keep-global-symbol=_ZT[ISV]N3tvm3ffi*", str(joined),
              str(out / OBJECT_NAME)], "objcopy of the slot object")
        joined.unlink()

    directory, _ = cache.get_or_build(key, build)
    return directory / OBJECT_NAME
