"""Instantiate the CUDA templates for a variant and link one shared library exporting TVM-FFI functions.

Per (head_dim, dtype) and template family (decode, prefill, TVM slots) one translation unit
holds the template instances and host wrappers, e.g. ``batch_decode_paged_<layout>_<dtype>_d<D>``.
Each TU is compiled by nvcc for all requested archs (one fatbin per arch inside the object),
TUs in parallel; the link uses the static CUDA runtime, so the library needs only
libcuda (the driver) and libtvm_ffi, and loads with ``tvm_ffi.load_module``.

Decode calling convention (all tensors on one CUDA device, the current stream is used):
``(q[B,Hq,D], pages, indices[nnz], indptr[B+1], last_page_len[B], o[B,Hq,D], lse[B,Hq],
part_o[B,C,Hq,D] f32, part_lse[B,C,Hq] f32, sm_scale, num_chunks, backend, plan, plan_ctas, plan_merges,
<extra params...>)``; with ``plan_ctas`` > 0, ``plan`` is the device copy of a split-KV plan
(runtime/decode_plan.py), the grid is (plan_ctas, Hkv), part_o / part_lse are [slots, Hq, (D)] and
``num_chunks`` is ignored;
``backend`` 0 lets the launcher choose, 1 forces the CUDA-core template, 2 the tensor-core one (which
falls back to CUDA cores where the device's shared memory cannot hold its smallest tile).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import attngen
from attngen.ir import TensorParam
from attngen.schedules.arch import arch_spec
from attngen.schedules.build_config import DTYPE_SHORT, BuildConfig, symbol

from . import nvcc
from .cuda_variant import C_TYPES

CSRC = Path(attngen.__file__).parent / "csrc"


def _ffi_paths():
    import tvm_ffi.libinfo as li

    return Path(li.find_include_path()), Path(li.find_dlpack_include_path()), Path(li.find_libtvm_ffi())


def _extra_args(variant) -> tuple[str, str]:
    """(C++ parameter list, Params-filling statements) for the variant's extra parameters."""
    decl, fill = [], []
    for p in variant.params:
        if isinstance(p, TensorParam):
            decl.append(f"tvm::ffi::TensorView {p.name}")
            fill.append(f"  hp.{p.name} = static_cast<{C_TYPES[p.dtype]}*>(attngen::data_of({p.name}));")
        elif "int" in p.dtype:
            decl.append(f"int64_t {p.name}")
            fill.append(f"  hp.{p.name} = static_cast<{C_TYPES[p.dtype]}>({p.name});")
        else:
            decl.append(f"double {p.name}")
            fill.append(f"  hp.{p.name} = static_cast<float>({p.name});")
    return "".join(", " + d for d in decl), "\n".join(fill)


def decode_wrapper(variant, head_dim: int, dtype: str, layout: str, max_group: int) -> str:
    name = symbol(f"batch_decode_paged_{layout.lower()}", dtype, head_dim)
    decl, fill = _extra_args(variant)
    hnd = "true" if layout == "HND" else "false"
    return f"""
static void {name}(tvm::ffi::TensorView q, tvm::ffi::TensorView pages, tvm::ffi::TensorView indices,
    tvm::ffi::TensorView indptr, tvm::ffi::TensorView last_page_len, tvm::ffi::TensorView o,
    tvm::ffi::TensorView lse, tvm::ffi::TensorView part_o, tvm::ffi::TensorView part_lse, double sm_scale,
    int64_t num_chunks, int64_t backend, tvm::ffi::TensorView plan, int64_t plan_ctas,
    int64_t plan_merges{decl}) {{
  using V = attngen_gen::Hooks_d{head_dim};
  using T = {C_TYPES[dtype]};
  V::Params hp{{}};
{fill}
  attngen::DecodeProblem P{{}};
  attngen::fill_decode(P, q, o, lse, sm_scale,
                       attngen::kv_from_pages(P.kv, pages, {hnd}, indptr, indices, last_page_len), "{name}");
  P.part_o = static_cast<float*>(attngen::data_of(part_o));
  P.part_lse = static_cast<float*>(attngen::data_of(part_lse));
  P.num_chunks = static_cast<int>(num_chunks);
  P.backend = static_cast<int>(backend);
  P.plan = plan_ctas > 0 ? static_cast<const int32_t*>(attngen::data_of(plan)) : nullptr;
  P.plan_ctas = static_cast<int>(plan_ctas);
  P.plan_max_merges = static_cast<int>(plan_merges);
  if (P.group > {max_group})
    TVM_FFI_THROW(ValueError) << "{name}: group size " << P.num_qo_heads << "/" << P.num_kv_heads
        << " is not served; this library was built with max_group_size={max_group}";
  if (P.batch == 0) return;
  if (P.num_chunks < 1) TVM_FFI_THROW(ValueError) << "{name}: num_chunks must be at least 1";
  if (P.backend < 0 || P.backend > 2)
    TVM_FFI_THROW(ValueError) << "{name}: backend must be 0 (automatic), 1 (CUDA cores) or 2 (tensor cores)";
  if (!P.plan && P.num_chunks > 1 && (part_o.numel() < int64_t(P.batch) * P.num_chunks * P.num_qo_heads * {head_dim} ||
                           part_lse.numel() < int64_t(P.batch) * P.num_chunks * P.num_qo_heads))
    TVM_FFI_THROW(ValueError) << "{name}: part_o / part_lse are smaller than batch x num_chunks x heads";
  if (!attngen::launch_decode<V, T, {head_dim}, {max_group}>(P, hp, attngen::stream_of(q)))
    TVM_FFI_THROW(ValueError) << "{name}: no tensor-core decode tile fits this device's shared memory, and a "
                                 "split-KV plan needs one; plan with tensor_cores=False";
  attngen::check_launch("{name}");
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, {name});
"""


def prefill_wrapper(variant, head_dim: int, dtype: str, layout: str | None) -> str:
    """``layout`` None: ragged K/V; else paged with that layout."""
    kind = "batch_prefill_ragged" if layout is None else f"batch_prefill_paged_{layout.lower()}"
    name = symbol(kind, dtype, head_dim)
    decl, fill = _extra_args(variant)
    if layout is None:
        kv_args = "tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView kv_indptr"
        kv_heads = "attngen::kv_from_ragged<T>(P.kv, k, v, kv_indptr)"
    else:
        kv_args = ("tvm::ffi::TensorView pages, tvm::ffi::TensorView indices, tvm::ffi::TensorView indptr, "
                   "tvm::ffi::TensorView last_page_len")
        hnd = "true" if layout == "HND" else "false"
        kv_heads = f"attngen::kv_from_pages(P.kv, pages, {hnd}, indptr, indices, last_page_len)"
    return f"""
static void {name}(tvm::ffi::TensorView q, {kv_args}, tvm::ffi::TensorView qo_indptr, tvm::ffi::TensorView o,
    tvm::ffi::TensorView lse, double sm_scale, int64_t max_qo_len, int64_t tile_rows{decl}) {{
  using V = attngen_gen::Hooks_d{head_dim};
  using T = {C_TYPES[dtype]};
  V::Params hp{{}};
{fill}
  attngen::PrefillProblem P{{}};
  attngen::fill_prefill(P, q, qo_indptr, o, lse, sm_scale, {kv_heads}, "{name}");
  P.tile_rows = static_cast<int>(tile_rows);
  if (P.tile_rows != 0 && P.tile_rows != 64 && P.tile_rows != 128)
    TVM_FFI_THROW(ValueError) << "{name}: tile_rows must be 0 (the library's choice), 64 or 128";
  attngen::launch_prefill<V, T, {head_dim}>(P, static_cast<int>(max_qo_len), hp, attngen::stream_of(q));
  attngen::check_launch("{name}");
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, {name});
"""


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
