"""TVM's own PagedKVCache helper kernels (not attention) for the CPU, built once and cached.

A PagedKVCache needs, besides its attention slots, kernels that move data: append new
k/v into pages, read k/v back (debug), split fused qkv and apply RoPE, copy a page
(fork), compact pages. attngen has nothing to add there, so these are TVM's kernels
(``relax.frontend.nn.llm.kv_cache``), scheduled with dlight's fallback rule and built by
LLVM exactly as TVM's ``TIRPagedKVCache`` does for an ``llvm`` target, cached by a
content hash of their TIR text.
"""
from __future__ import annotations

from pathlib import Path

import tvm
from tvm.target import Target

from attngen.codegen.cache import BuildCache, content_key

LIBRARY_NAME = "libtvm_kv_cache_kernels_cpu.so"
# role -> exported symbol
SYMBOLS = {
    "transpose_append": "tvm_kv_cache_transpose_append",
    "debug_get_kv": "tvm_kv_cache_debug_get_kv",
    "split_rotary": "tvm_kv_cache_split_rotary",
    "copy_single_page": "tvm_kv_cache_copy_single_page",
    "compact_copy": "tvm_kv_cache_compact_copy",
}


def _programs(*, num_layers: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, dtype: str,
              page_size: int, rope_scale: float, rope_theta: float) -> dict:
    from tvm.relax.frontend.nn.llm import kv_cache as kvc

    no_scaling: dict = {}
    return {
        "transpose_append": kvc._kv_cache_transpose_append(num_kv_heads, head_dim, dtype, page_size),
        "debug_get_kv": kvc._kv_cache_debug_get_kv(num_layers, num_kv_heads, head_dim, dtype),
        "split_rotary": kvc.llama_rope_with_position_map(rope_theta, rope_scale, head_dim, num_qo_heads,
                                                         num_kv_heads, dtype, no_scaling),
        "copy_single_page": kvc._copy_single_page_cpu(num_kv_heads, page_size, head_dim, dtype),
        "compact_copy": kvc._compact_kv_copy_cpu(num_kv_heads, head_dim, dtype, page_size),
    }


def build_tvm_cache_kernels(cache: BuildCache | None = None, **shape) -> Path:
    """Library exporting ``SYMBOLS``; ``shape``: num_layers, num_qo_heads, num_kv_heads, head_dim,
    dtype, page_size, rope_scale, rope_theta."""
    from tvm.s_tir import dlight as dl

    cache = cache or BuildCache()
    target = Target({"kind": "llvm"})
    programs = _programs(**shape)
    mod = tvm.IRModule({tvm.ir.GlobalVar(SYMBOLS[role]): f.with_attr("global_symbol", SYMBOLS[role])
                        for role, f in programs.items()})
    key = content_key({"what": "tvm_cache_kernels", "tir": mod.script(), "target": str(target),
                       "tvm": tvm.__version__})

    def build(out: Path) -> None:
        with target:
            scheduled = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(mod)
        tvm.tirx.build(scheduled, target=target).export_library(str(out / LIBRARY_NAME))

    directory, _ = cache.get_or_build(key, build)
    return directory / LIBRARY_NAME
