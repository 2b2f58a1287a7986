"""Instantiate the CUDA templates for a variant and link one shared library exporting TVM-FFI functions.

Per (head_dim, dtype pair) and selected template record (decode, prefill, TVM slots) one translation
unit holds the template instances and host wrappers, e.g. ``batch_decode_paged_<layout>_<dtype>_d<D>``:
the record names its entry headers and its exports, and an emitter key that ``ENTRY_EMITTERS`` maps to
the C++ emitters of :mod:`.cuda_entries` and :mod:`.cuda_tvm_slots`. Every TU includes
``tile_checks.h``, which static_asserts the templates' tiles against the records (``attngen_tiles.h``).
Each TU is compiled by nvcc for all requested archs (one fatbin per arch inside the object), TUs in
parallel; the link uses the static CUDA runtime, so the library needs only libcuda (the driver) and
libtvm_ffi, and loads with ``tvm_ffi.load_module``.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import tvm_ffi.libinfo

import attngen
from attngen.schedules.arch import arch_spec, smem_optin_floor
from attngen.schedules.build_config import BuildConfig, symbol
from attngen.schedules.dtypes import DtypePair
from attngen.schedules.registry import companion_macros, every_arch_macros, selected

from . import nvcc
from .cuda_entries import SCALED_KV_HEADERS, decode_wrapper, prefill_wrapper, tile_map_wrapper
from .cuda_tvm_slots import flashinfer_slot_wrappers, tvm_slot_wrappers

CSRC = Path(attngen.__file__).parent / "csrc"


def _ffi_paths():
    li = tvm_ffi.libinfo
    return Path(li.find_include_path()), Path(li.find_dlpack_include_path()), Path(li.find_libtvm_ffi())


def _decode_entries(variant, cfg: BuildConfig, head_dim: int, pair: DtypePair) -> list[str]:
    return [decode_wrapper(head_dim, pair, lay, cfg.max_group_size) for lay in cfg.layouts]


def _prefill_entries(variant, cfg: BuildConfig, head_dim: int, pair: DtypePair) -> list[str]:
    return [prefill_wrapper(head_dim, pair, lay) for lay in (None, *cfg.layouts)] + [  # None: ragged
        tile_map_wrapper(head_dim, pair)]


def _tvm_slots(variant, cfg: BuildConfig, head_dim: int, pair: DtypePair) -> list[str]:
    constants = dict(cfg.tvm_constants)
    return [tvm_slot_wrappers(variant, head_dim, pair.q, constants, cfg.tvm_window, cfg.tvm_rope),
            flashinfer_slot_wrappers(variant, head_dim, pair.q, constants)]


# TemplateRecord.emitter keys -> (variant, config, head_dim, dtype pair) -> C++ of the record's exports. The decode
# and prefill emitters read the pair's K/V dtype: BuildConfig admits fp8 K/V on cuda for those templates only.
ENTRY_EMITTERS = {
    "decode_entries": _decode_entries,
    "prefill_entries": _prefill_entries,
    "tvm_slots": _tvm_slots,
}


def exported_functions(cfg: BuildConfig) -> list[str]:
    """Every function the library of ``cfg`` exports, sorted: the selected records' exports per head_dim
    and dtype pair."""
    return sorted(symbol(kind, pair.q, d, pair.kv) for record in selected(cfg.kernels) for d in cfg.head_dims
                  for pair in cfg.dtype_pairs for kind in record.kinds(cfg.layouts))


def translation_units(variant, cfg: BuildConfig, head_dim: int, pair: DtypePair, split: bool = True) -> dict[str, str]:
    """One source per selected template record of one (head_dim, dtype pair), so that nvcc compiles them in
    parallel: file name -> source.

    The decode and prefill units are split by pass: nvcc's device pass (``__CUDA_ARCH__``) sees the kernels'
    launchers, explicitly instantiated as the entries instantiate them (the link-time build's instantiation
    lists, codegen/lto.py ``LAUNCHERS``), and not the host glue, whose TVM-FFI headers took a fifth of the
    device pass (per arch) to parse; the host pass sees the unit as before. The kernels' machine code is
    byte for byte that of an unsplit unit (``split=False``; tests/test_cuda_codegen.py)."""
    units = {}
    for record in selected(cfg.kernels):
        host = [f'#include "variant_d{head_dim}.cuh"', '#include "problem_glue.h"']
        host += [f'#include "{h}"' for h in record.headers]
        host += [f'#include "{h}"' for h in SCALED_KV_HEADERS.get(record.name, ()) if pair.kv_scaled]
        host.append('#include "tile_checks.h"')
        host += ENTRY_EMITTERS[record.emitter](variant, cfg, head_dim, pair)
        device = device_pass_lines(record.name, cfg, head_dim, pair) if split else None
        if device is None:
            parts = host
        else:
            parts = ["#define ATTNGEN_DEVICE_SPLIT 1", f'#include "variant_d{head_dim}.cuh"', "#ifdef __CUDA_ARCH__",
                     *device, "#else", *host[1:], "#endif  // __CUDA_ARCH__"]
        units[f"attention_d{head_dim}_{pair.short}_{record.name}.cu"] = "\n".join(parts) + "\n"
    return units


def device_pass_lines(record: str, cfg: BuildConfig, head_dim: int, pair: DtypePair) -> list[str] | None:
    """A split unit's device pass: its launchers' header and their explicit instances over the whole-program
    traits (every part of the record, the companion templates' included: they compile to nothing without
    their build macro); None for records without a launcher list (the TVM slots)."""
    from .lto import LAUNCHERS

    launcher = LAUNCHERS.get(record)
    if launcher is None:
        return None
    instances = [i for part in range(len(launcher.parts))
                 for i in launcher.instances(part, head_dim, pair, cfg.max_group_size, device_pass=True)]
    return [f'#include "{launcher.header}"', '#include "tile_checks.h"', *dict.fromkeys(instances)]


def _tu_flags(out_dir: Path, cfg: BuildConfig) -> tuple[str, ...]:
    """nvcc flags of every TU but the gencodes: includes, the companion templates' macros (the Hopper
    prefill, compiled in where some arch of the build runs it; and its every-arch macro where every arch
    does), the shared-memory floor of the build's archs (arch.smem_optin_floor), fast math where asked."""
    ffi_inc, dlpack_inc, _ = _ffi_paths()
    archs = [arch_spec(a) for a in cfg.archs]
    defines = tuple(f"-D{m}" for m in companion_macros(archs, cfg.kernels) + every_arch_macros(archs, cfg.kernels))
    floor = smem_optin_floor(cfg.archs)
    defines += (f"-DATTNGEN_SMEM_OPTIN_FLOOR={floor}",) if floor else ()
    return (("-Xcompiler", "-fPIC", f"-I{CSRC}", f"-I{out_dir}", f"-I{ffi_inc}", f"-I{dlpack_inc}", *defines,
             "--expt-relaxed-constexpr") + (("--use_fast_math",) if cfg.fast_math else ()))


def compile_device_code(out_dir: Path, tus: list[str], cfg: BuildConfig) -> list[Path]:
    """``link="check"``: each TU's device code alone, one cubin per (TU, arch), in parallel; no host code,
    no library. Returns the cubins."""
    flags = _tu_flags(out_dir, cfg)
    jobs = [nvcc.NvccJob(out_dir / tu, out_dir / f"{Path(tu).stem}_{a}.cubin", arch_spec(a).gencode, flags,
                         mode="-cubin") for tu in tus for a in cfg.archs]
    nvcc.run_jobs(jobs)
    return [j.output for j in jobs]


def compile_library(out_dir: Path, tus: list[str], cfg: BuildConfig, name: str) -> Path:
    """nvcc every TU (all archs in each) in parallel, then link ``lib<name>_cuda.so``."""
    _, _, ffi_lib = _ffi_paths()
    gencodes = " ".join(arch_spec(a).gencode for a in cfg.archs).split()
    flags = (*gencodes[1:], *_tu_flags(out_dir, cfg))
    jobs = [nvcc.NvccJob(out_dir / tu, out_dir / (Path(tu).stem + ".o"), gencodes[0], flags) for tu in tus]
    nvcc.run_jobs(jobs)
    lib = out_dir / f"lib{name}_cuda.so"
    cmd = [nvcc.require_nvcc(), "-shared", "-cudart", "static", *gencodes, "-o", str(lib),
           *[str(j.output) for j in jobs], f"-L{ffi_lib.parent}", "-ltvm_ffi", f"-Xlinker=-rpath={ffi_lib.parent}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise nvcc.NvccError(f"link failed:\n$ {' '.join(cmd)}\n{p.stderr}")
    return lib
