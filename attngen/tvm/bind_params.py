"""A variant's tensor parameters in a model library's cache: constants of the model, bound to the slot functions.

TVM's slot calls carry no variant parameters; at run time attngen binds the tensors in Python
(slot_params.bind_trailing). A model library runs without attngen or Python callbacks, so there the
binding is part of the model: the tensors' values become Relax constants of the cache-creating function,
and a small exported function of the model (csrc/tvm_bind_params.cc, compiled here with the host C++
compiler) wraps each attention function into one that appends the tensors, copied once to the device of
the call (``emit_bound_slots``). Both devices use it: the CPU's slot PrimFuncs and the CUDA object's
functions take the tensors as trailing arguments alike; on the CPU the binding is an object of its own per
cache prefix, on CUDA part of attngen's object (tvm/cuda.py ``slot_object``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

import attngen
from attngen.codegen.cache import BuildCache, content_key, hash_files
from attngen.codegen.host_library import host_cxx

CSRC = Path(attngen.__file__).parent / "csrc"
SOURCE = CSRC / "tvm_bind_params.cc"
OBJECT_NAME = "attngen_tvm_bind_params.o"


def bind_function_name(prefix: str) -> str:
    """The exported name (``__tvm_ffi_<name>`` in the object) of the binding function of caches named ``prefix``."""
    return f"{prefix}_bind_tensor_params"


# the binding's name inside attngen's CUDA object, which renames its exports to ``<prefix>_<name>``
# (codegen/cuda_object.py)
UNPREFIXED = "bind_tensor_params"


def bind_object(name: str, cache: BuildCache | None = None) -> Path:
    """The object file exporting the binding function as ``name`` (built once per name and compiler, cached): on
    the CPU it is linked into the model as it is; on CUDA it joins attngen's CUDA object (``UNPREFIXED``), so
    that the two share one copy of tvm-ffi's inline functions."""
    import subprocess

    import tvm_ffi.libinfo as li

    if not name.isidentifier():
        raise ValueError(f"name_prefix: {name!r} must be a C identifier")
    cxx, version = host_cxx()
    cache = cache or BuildCache()
    flags = ["-std=c++17", "-O2", "-c", "-fPIC", f"-DATTNGEN_BIND_EXPORT={name}"]
    key = content_key({"bind_params": hash_files([SOURCE]), "flags": flags, "cxx": version,
                       "attngen": attngen.__version__})

    def build(out: Path) -> None:
        cmd = [cxx, *flags, f"-I{li.find_include_path()}", f"-I{li.find_dlpack_include_path()}", str(SOURCE), "-o",
               str(out / OBJECT_NAME)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"the tensor-parameter binding's object failed to compile:\n$ {' '.join(cmd)}\n"
                               f"{p.stderr[-4000:]}")

    directory, _ = cache.get_or_build(key, build)
    return directory / OBJECT_NAME


def host_values(variant, values: list) -> list[np.ndarray]:
    """The tensor parameters' values (``split_params``' list, declaration order) as contiguous host arrays of their
    declared dtypes."""
    out = []
    for decl, value in zip(variant.tensor_params, values):
        array = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        out.append(np.ascontiguousarray(array.astype(decl.dtype, copy=False)))
    return out


def emit_bound_slots(bb, attention: dict, arrays: list[np.ndarray], prefix: str) -> dict:
    """The create call's attention entries (role -> (convention, function[, plan])) with each "tirx" function and
    each "flashinfer" run function replaced by its binding to ``arrays`` (Relax constants), emitted into ``bb``'s
    current function; the plans take no tensors."""
    from tvm import relax as rx

    consts = rx.Tuple([rx.const(a) for a in arrays])
    bind = rx.ExternFunc(bind_function_name(prefix))

    def bound(fn):
        return bb.emit(rx.call_pure_packed(bind, fn, consts, ty_args=rx.ObjectType()))

    return {role: (convention, bound(fn), *rest) for role, (convention, fn, *rest) in attention.items()}


def static_library(prefix: str, cache: BuildCache | None = None):
    """The binding's object of caches named ``prefix`` as a static library for a CPU model's ``external_mods``."""
    import tvm

    name = bind_function_name(prefix)
    return tvm.runtime.load_static_library(str(bind_object(name, cache)), [name])
