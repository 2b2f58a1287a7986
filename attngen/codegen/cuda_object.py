"""One relocatable object file of attngen's TVM PagedKVCache functions, for static linking into a
TVM model library (the way TVM links FlashInfer: object files exporting TVM-FFI functions).

The object holds a variant's TVM-slot translation unit (``kernels=("tvm",)``: both slot
conventions), attngen's state-merge kernels and the CUDA runtime (static), joined by ``ld -r``.
Every symbol is then made local except the TVM-FFI exports, renamed ``__tvm_ffi_<prefix>_<name>``
(and tvm-ffi's own weak template symbols, which the model library shares with libtvm_ffi), so
two objects with different prefixes, or the model's own CUDA code, never collide.
"""
from __future__ import annotations

from pathlib import Path

import attngen

from . import nvcc
from .cache import BuildCache, content_key, hash_files
from .host_library import csrc_hash, merge_object

OBJECT_NAME = "attngen_tvm_slots.o"


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
        nvcc.run_tool(["ld", "-r", "-o", str(joined), *map(str, objects), str(merge), str(nvcc.cudart_static())],
                      "ld -r of the slot objects")
        renames = out / "renames.txt"
        renames.write_text("".join(f"__tvm_ffi_{e} __tvm_ffi_{prefix}_{e}\n" for e in exports))
        nvcc.run_tool(["objcopy", f"--redefine-syms={renames}", "--wildcard",
                       f"--keep-global-symbol=__tvm_ffi_{prefix}_*", "--keep-global-symbol=_ZN3tvm3ffi*",
                       "--keep-global-symbol=_ZT[ISV]N3tvm3ffi*", str(joined), str(out / OBJECT_NAME)],
                      "objcopy of the slot object")
        joined.unlink()

    directory, _ = cache.get_or_build(key, build)
    return directory / OBJECT_NAME
