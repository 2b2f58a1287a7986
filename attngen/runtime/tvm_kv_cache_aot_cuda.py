"""Ahead of time on CUDA: attngen's CUDA PagedKVCache functions linked statically into a TVM model library.

The CUDA counterpart of ``tvm_kv_cache_aot`` (which compiles CPU kernels into the model as
PrimFuncs). Here the attention and merge slots are attngen's CUDA functions
(codegen/cuda_tvm_slots.py), built once into one object file (codegen/cuda_object.py: the
variant's slot functions, the merge kernels, the CUDA runtime linked in, every other symbol
local) and attached to the model's IRModule as a static library in ``external_mods`` — the
way TVM attaches FlashInfer's objects. ``emit_paged_kv_cache_cuda`` emits the
``vm.builtin.paged_attention_kv_cache_create`` call naming those functions (``ExternFunc``),
with TVM's own data-moving kernels as PrimFuncs of the model; ``tvm.compile`` + export
link everything into one library, from which the Relax VM creates the cache with no attngen
and no Python at run time.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Sequence

from attngen.schedules.build_config import DTYPE_SHORT, symbol

from .tvm_kv_cache import PLACEHOLDER_WINDOW, _check_cache_args, _rope_mode
from .tvm_kv_cache_aot import emit_create_call


def slot_object(variant, *, head_dim: int, dtype: str, arch: str, params: dict | None = None,
                name_prefix: str = "attngen", cache=None) -> tuple[Path, dict]:
    """Build (cached) the object file; returns it and role -> exported name: "prefill_ragged", "prefill",
    "decode" (the ("tirx", fn) functions), "fi_prefill_ragged", "fi_prefill", "fi_decode" ((run, plan)
    pairs) and "merge"."""
    from attngen.codegen.cuda_object import build_slot_object
    from attngen.codegen.cuda_tvm_slots import tvm_slot_functions
    from attngen.schedules.arch import arch_spec

    from .tvm_kv_cache_cuda import build_slot_library

    built = build_slot_library(variant, head_dim=head_dim, dtype=dtype, params=params, arch=arch, cache=cache)
    merge = f"merge_state_inplace_{DTYPE_SHORT[dtype]}"
    exports = tvm_slot_functions((head_dim,), (dtype,)) + [merge]
    obj = build_slot_object(sorted(built.directory.glob("attention_*.o")), exports,
                            gencodes=arch_spec(arch).gencode.split(), prefix=name_prefix, cache=cache)
    n = lambda kind: f"{name_prefix}_{symbol(kind, dtype, head_dim)}"  # noqa: E731
    roles = {"prefill_ragged": n("tvm_prefill_ragged"), "prefill": n("tvm_prefill_paged"), "decode": n("tvm_decode"),
             "fi_prefill_ragged": (n("tvm_fi_prefill_ragged_run"), n("tvm_fi_prefill_plan")),
             "fi_prefill": (n("tvm_fi_prefill_paged_run"), n("tvm_fi_prefill_plan")),
             "fi_decode": (n("tvm_fi_decode_run"), n("tvm_fi_decode_plan")),
             "merge": f"{name_prefix}_{merge}"}
    return obj, roles


def emit_paged_kv_cache_cuda(bb, variant=None, *, num_layers: int, num_qo_heads: int, num_kv_heads: int,
                             head_dim: int, dtype: str = "float16", page_size: int = 16, max_batch: int,
                             max_total_tokens: int, prefill_chunk: int, arch: str, rope_mode="none",
                             rope_scale: float = 1.0, rope_theta: float = 1e4,
                             attn_kinds: Sequence[str] | None = None, params: dict | None = None,
                             convention: str = "tirx", name_prefix: str = "attngen", cache=None):
    """Emit the cache's create call into ``bb``'s current function. Returns (the Relax var holding the cache,
    the static-library module to put in the IRModule's ``external_mods``). Arguments as
    ``create_paged_kv_cache(target="cuda")``; ``arch`` is the GPU the model library is built for
    (e.g. "sm_90a"); ``name_prefix`` prefixes every exported function (one prefix per cache of a model)."""
    import tvm
    from tvm import relax as rx

    from attngen.variants import builtin

    from .tvm_kv_cache_cuda import check_cuda_cache_args, tvm_cuda_programs

    kinds = _check_cache_args(num_layers=num_layers, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                              page_size=page_size, max_batch=max_batch, max_total_tokens=max_total_tokens,
                              prefill_chunk=prefill_chunk, attn_kinds=attn_kinds, support_sliding_window=False)
    mode = _rope_mode(rope_mode)
    check_cuda_cache_args(convention=convention, rope_mode=mode, kinds=kinds)
    variant = variant if variant is not None else builtin("vanilla")
    obj, fn = slot_object(variant, head_dim=head_dim, dtype=dtype, arch=arch, params=params,
                          name_prefix=name_prefix, cache=cache)
    programs, _ = tvm_cuda_programs(num_layers=num_layers, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                                    head_dim=head_dim, dtype=dtype, page_size=page_size,
                                    rope_scale=float(rope_scale), rope_theta=float(rope_theta), arch=arch)
    helpers = {gv.name_hint[len("tvm_"):]: bb.add_func(programs[gv].without_attr("global_symbol"),
                                                       f"{name_prefix}_{gv.name_hint}")
               for gv in programs.get_global_vars()}
    ext = rx.ExternFunc
    if convention == "tirx":
        main = [rx.Tuple([tvm.ir.StringImm("tirx"), ext(fn[r])]) for r in ("prefill_ragged", "prefill", "decode")]
    else:
        main = [rx.Tuple([tvm.ir.StringImm("flashinfer"), ext(fn[r][0]), ext(fn[r][1])])
                for r in ("fi_prefill_ragged", "fi_prefill", "fi_decode")]
    # TVM never calls the sliding-window slots here (sliding layers are refused above); they hold the main ones
    sliding = [rx.Tuple([tvm.ir.StringImm("tirx"), ext(fn[r])]) for r in ("prefill", "decode")]
    cache_var = emit_create_call(
        bb, sizes=[max_batch, max_total_tokens, prefill_chunk, page_size, 0, PLACEHOLDER_WINDOW], num_layers=num_layers,
        num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, kinds=kinds, rope_mode=mode,
        rope_scale=rope_scale, rope_theta=rope_theta, dtype=dtype, helpers=helpers, slots=main + sliding,
        merge=ext(fn["merge"]))
    exported = [fn[r] for r in ("prefill_ragged", "prefill", "decode", "merge")]
    exported += [x for r in ("fi_prefill_ragged", "fi_prefill", "fi_decode") for x in fn[r]]
    return cache_var, tvm.runtime.load_static_library(str(obj), sorted(set(exported)))


def paged_kv_cache_module_cuda(variant=None, **kwargs):
    """An IRModule whose Relax function ``create_kv_cache()`` returns the cache, with attngen's object in its
    ``external_mods`` (arguments as ``emit_paged_kv_cache_cuda``)."""
    from tvm import relax as rx

    bb = rx.BlockBuilder()
    with bb.function("create_kv_cache", []):
        cache_var, static_lib = emit_paged_kv_cache_cuda(bb, variant, **kwargs)
        bb.emit_func_output(cache_var)
    mod = bb.get()
    mods = list(mod.attrs["external_mods"]) if mod.attrs and "external_mods" in mod.attrs else []
    return mod.with_attr("external_mods", mods + [static_lib])


def export_model_library_cuda(mod, path: str | Path, arch: str) -> Path:
    """Compile a model IRModule holding attngen's CUDA object for ``arch`` and export it as a shared library
    (no GPU needed: nvcc builds every kernel)."""
    import tvm
    from tvm.target import Target

    path = Path(path)
    target = Target({"kind": "cuda", "arch": arch}, host={"kind": "llvm"})
    with _tvm_nvcc_precise(), target:
        executable = tvm.compile(mod, target=target)
    executable.export_library(str(path), fcompile=_create_shared_with_libstdcxx)
    return path


def _create_shared_with_libstdcxx(output: str, objects: list[str], **kwargs) -> None:
    """TVM's shared-library link with the shared C++ runtime named after the objects. attngen's object
    needs libstdc++ symbols (exceptions, operator new); a toolchain whose own library directory holds only
    a non-PIC ``libstdc++.a`` would otherwise link that archive and fail ("relocation ... can not be used
    when making a shared object"). After the objects, the shared library satisfies those references even
    under ``--as-needed``."""
    from tvm.support import cc

    cc.create_shared(output, list(objects) + libstdcxx_shared(), **kwargs)


def libstdcxx_shared() -> list[str]:
    """The shared C++ runtime to link: the one loaded in this process (the model will run with it), else the
    compiler's ``libstdc++.so``; empty when neither is found (the compiler's default then applies)."""
    try:
        with open("/proc/self/maps") as maps:
            loaded = sorted({line.split()[-1] for line in maps if "/libstdc++.so" in line})
    except OSError:
        loaded = []
    for lib in loaded:
        if os.path.isfile(lib):
            return [lib]
    from tvm.support import cc

    found = subprocess.run([cc.get_cc() or "g++", "-print-file-name=libstdc++.so"], capture_output=True, text=True)
    lib = found.stdout.strip()
    return [lib] if found.returncode == 0 and os.path.isabs(lib) and os.path.isfile(lib) else []


@contextlib.contextmanager
def _tvm_nvcc_precise():
    """TVM compiles the model's own CUDA kernels with nvcc (a fatbin, on any machine: its default NVRTC path
    needs the CUDA driver) and without --use_fast_math (its split + RoPE kernel then uses precise sin / cos,
    as attngen's kernels do)."""
    keys = {"TVM_CUDA_COMPILE_MODE": "nvcc", "TVM_CUDA_NVCC_NO_FAST_MATH": "1"}
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
