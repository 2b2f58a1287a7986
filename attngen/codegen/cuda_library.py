"""Instantiate the CUDA templates for a variant and link one shared library exporting TVM-FFI functions.

Per (head_dim, dtype) and template family (decode, prefill, TVM slots) one translation unit
holds the template instances and host wrappers, e.g. ``batch_decode_paged_<layout>_<dtype>_d<D>``.
Each TU is compiled by nvcc for all requested archs (one fatbin per arch inside the object),
TUs in parallel; the link uses the static CUDA runtime, so the library needs only
libcuda (the driver) and libtvm_ffi, and loads with ``tvm_ffi.load_module``.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import attngen
from attngen.schedules.arch import arch_spec
from attngen.schedules.build_config import DTYPE_SHORT, BuildConfig, symbol

from . import nvcc
from .cuda_entries import decode_wrapper, prefill_wrapper

CSRC = Path(attngen.__file__).parent / "csrc"


def _ffi_paths():
    import tvm_ffi.libinfo as li

    return Path(li.find_include_path()), Path(li.find_dlpack_include_path()), Path(li.find_libtvm_ffi())


def exported_functions(cfg: BuildConfig) -> list[str]:
    from .cuda_tvm_slots import tvm_slot_functions

    names = tvm_slot_functions(cfg.head_dims, cfg.dtypes) if "tvm" in cfg.kernels else []
    for d in cfg.head_dims:
        for dt in cfg.dtypes:
            if "decode" in cfg.kernels:
                names += [symbol(f"batch_decode_paged_{lay.lower()}", dt, d) for lay in cfg.layouts]
            if "prefill" in cfg.kernels:
                names.append(symbol("batch_prefill_ragged", dt, d))
                names += [symbol(f"batch_prefill_paged_{lay.lower()}", dt, d) for lay in cfg.layouts]
    return sorted(names)


def translation_units(variant, cfg: BuildConfig, head_dim: int, dtype: str) -> dict[str, str]:
    """One source per template family (decode, prefill, TVM slots) of one (head_dim, dtype), so that
    nvcc compiles them in parallel: file name -> source."""
    head = [f'#include "variant_d{head_dim}.cuh"', '#include "problem_glue.h"']
    stem = f"attention_d{head_dim}_{DTYPE_SHORT[dtype]}"
    units = {}
    if "decode" in cfg.kernels:
        units[f"{stem}_decode.cu"] = head + ['#include "decode_launch.cuh"'] + [
            decode_wrapper(variant, head_dim, dtype, lay, cfg.max_group_size) for lay in cfg.layouts]
    if "prefill" in cfg.kernels:
        units[f"{stem}_prefill.cu"] = head + ['#include "prefill.cuh"', prefill_wrapper(variant, head_dim, dtype, None)] + [
            prefill_wrapper(variant, head_dim, dtype, lay) for lay in cfg.layouts]
    if "tvm" in cfg.kernels:
        from .cuda_tvm_slots import flashinfer_slot_wrappers, tvm_slot_wrappers

        constants = dict(cfg.tvm_constants)
        units[f"{stem}_tvm.cu"] = head + ['#include "decode_launch.cuh"', '#include "prefill.cuh"',
                                          tvm_slot_wrappers(variant, head_dim, dtype, constants),
                                          flashinfer_slot_wrappers(variant, head_dim, dtype, constants)]
    return {name: "\n".join(parts) + "\n" for name, parts in units.items()}


def compile_library(out_dir: Path, tus: list[str], cfg: BuildConfig, name: str) -> Path:
    """nvcc every TU (all archs in each) in parallel, then link ``lib<name>_cuda.so``."""
    ffi_inc, dlpack_inc, ffi_lib = _ffi_paths()
    gencodes = " ".join(arch_spec(a).gencode for a in cfg.archs).split()
    flags = ("-Xcompiler", "-fPIC", f"-I{CSRC}", f"-I{out_dir}", f"-I{ffi_inc}", f"-I{dlpack_inc}",
             *gencodes[1:], "--expt-relaxed-constexpr") + (("--use_fast_math",) if cfg.fast_math else ())
    jobs = [nvcc.NvccJob(out_dir / tu, out_dir / (Path(tu).stem + ".o"), gencodes[0], flags) for tu in tus]
    nvcc.run_jobs(jobs)
    lib = out_dir / f"lib{name}_cuda.so"
    cmd = [nvcc.require_nvcc(), "-shared", "-cudart", "static", *gencodes, "-o", str(lib),
           *[str(j.output) for j in jobs], f"-L{ffi_lib.parent}", "-ltvm_ffi", f"-Xlinker=-rpath={ffi_lib.parent}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise nvcc.NvccError(f"link failed:\n$ {' '.join(cmd)}\n{p.stderr}")
    return lib
