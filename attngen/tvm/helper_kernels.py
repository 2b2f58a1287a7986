"""TVM's own PagedKVCache helper kernels (not attention), for the CPU and the GPU.

A PagedKVCache needs, besides its attention and merge slots, kernels that move data: append new
k/v into pages, read k/v back (debug), split fused qkv and apply RoPE, copy a page (fork), compact
pages. attngen has nothing to add there, so these are TVM's kernels
(``relax.frontend.nn.llm.kv_cache``), scheduled with dlight's fallback rule exactly as TVM's
``TIRPagedKVCache`` schedules them for the target. At run time they are built by LLVM into a
library cached by the content of their TIR (CPU), or by TVM in this process (GPU); ahead of time
they are added to the model as PrimFuncs.
"""
from __future__ import annotations

from pathlib import Path

from attngen.codegen.cache import BuildCache, content_key

from .create_call import HELPER_ROLES
from .loading import load_library
from .shape import CacheShape

LIBRARY_NAME = "libtvm_kv_cache_kernels_cpu.so"


def device_target(device: str, arch: str | None = None):
    """The TVM target of a cache's kernels: "cpu" -> LLVM, "cuda" -> CUDA for ``arch`` with an LLVM host."""
    from tvm.target import Target

    if device == "cpu":
        return Target({"kind": "llvm"})
    return Target({"kind": "cuda", "arch": arch}, host={"kind": "llvm"})


def _is_cpu(target) -> bool:
    return target.kind.name == "llvm"


def helper_programs(shape: CacheShape, target) -> dict:
    """Role (``HELPER_ROLES``) -> TVM's unscheduled PrimFunc for a cache of ``shape`` on ``target``."""
    from tvm.relax.frontend.nn.llm import kv_cache as kvc

    s, cpu = shape, _is_cpu(target)
    no_scaling: dict = {}
    return {
        "transpose_append": kvc._kv_cache_transpose_append(s.num_kv_heads, s.head_dim, s.dtype, s.page_size),
        "debug_get_kv": kvc._kv_cache_debug_get_kv(s.num_layers, s.num_kv_heads, s.head_dim, s.dtype),
        "split_rotary": kvc.llama_rope_with_position_map(float(s.rope_theta), float(s.rope_scale), s.head_dim,
                                                         s.num_qo_heads, s.num_kv_heads, s.dtype, no_scaling),
        "copy_single_page": (kvc._copy_single_page_cpu(s.num_kv_heads, s.page_size, s.head_dim, s.dtype) if cpu
                             else kvc._copy_single_page(s.num_kv_heads, s.page_size, s.head_dim, s.dtype, target)),
        "compact_copy": (kvc._compact_kv_copy_cpu(s.num_kv_heads, s.head_dim, s.dtype, s.page_size) if cpu
                         else kvc._compact_kv_copy(s.num_kv_heads, s.head_dim, s.dtype, target, s.page_size)),
    }


def helper_module(shape: CacheShape, target):
    """The helper kernels as an IRModule of PrimFuncs named (and exported as) ``tvm_<role>``, unscheduled."""
    import tvm

    return tvm.IRModule({tvm.ir.GlobalVar(f"tvm_{role}"): f.with_attr("global_symbol", f"tvm_{role}")
                         for role, f in helper_programs(shape, target).items()})


def schedule_helpers(mod, target):
    from tvm.s_tir import dlight as dl

    with target:
        return dl.ApplyDefaultSchedule(dl.gpu.Fallback())(mod)


def _build_cpu_library(mod, target, cache: BuildCache | None) -> Path:
    import tvm

    cache = cache or BuildCache()
    key = content_key({"what": "tvm_cache_kernels", "tir": mod.script(), "target": str(target),
                       "tvm": tvm.__version__})

    def build(out: Path) -> None:
        tvm.tirx.build(schedule_helpers(mod, target), target=target).export_library(str(out / LIBRARY_NAME))

    directory, _ = cache.get_or_build(key, build)
    return directory / LIBRARY_NAME


def helper_functions(shape: CacheShape, target, cache: BuildCache | None = None) -> dict:
    """Role -> built function, for a cache created in this process."""
    import tvm

    mod = helper_module(shape, target)
    if _is_cpu(target):
        library = load_library(_build_cpu_library(mod, target, cache))
    else:
        with target:
            library = tvm.tirx.build(schedule_helpers(mod, target), target=target)
    return {role: library[f"tvm_{role}"] for role in HELPER_ROLES}


def add_helpers(bb, shape: CacheShape, target, name_prefix: str) -> dict:
    """Add the scheduled helper kernels to ``bb``'s module as ``<name_prefix>_tvm_<role>``; role -> GlobalVar."""
    scheduled = schedule_helpers(helper_module(shape, target), target)
    return {role: bb.add_func(scheduled[f"tvm_{role}"].without_attr("global_symbol"), f"{name_prefix}_tvm_{role}")
            for role in HELPER_ROLES}
