"""Ahead of time: attngen's PagedKVCache kernels compiled into a TVM model library.

``create_paged_kv_cache`` (tvm_kv_cache.py) hands TVM already-built functions at run time.
For deployment the same kernels can instead live inside the model: ``emit_paged_kv_cache``
emits, into the Relax function a ``BlockBuilder`` is building, the
``vm.builtin.paged_attention_kv_cache_create`` call with every kernel added to the model's
IRModule as a TIR PrimFunc — attngen's five attention slots (the variant's hooks inlined,
scalar parameters compiled in) and its merge, next to TVM's own data-moving kernels — the
way TVM's ``TIRPagedKVCache`` adds its own. ``tvm.compile`` then builds them with the rest
of the model into one library; at run time the Relax VM creates the cache from that library
alone (no attngen, no Python callbacks). ``paged_kv_cache_module`` wraps this into a module
whose single function ``create_kv_cache()`` returns the cache, and ``export_model_library``
compiles and exports one.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .tvm_kv_cache import ATTN_KINDS, ROPE_MODES, SLOT_ROLES, _check_cache_args, _rope_mode

# the common-subexpression pass binds float subexpressions of the inlined hooks in a way LLVM's
# lowering rejects (see attngen/codegen/cpu/build.py); every build of these kernels turns it off
BUILD_CONFIG = {"tirx.disable_cse_tir": True}


def emit_paged_kv_cache(bb, variant=None, *, num_layers: int, num_qo_heads: int, num_kv_heads: int,
                        head_dim: int, dtype: str = "float32", page_size: int = 16, max_batch: int,
                        max_total_tokens: int, prefill_chunk: int, rope_mode="none", rope_scale: float = 1.0,
                        rope_theta: float = 1e4, attn_kinds: Sequence[str] | None = None,
                        sliding_window: int = 1024, support_sliding_window: bool = False,
                        params: dict | None = None, name_prefix: str = "attngen"):
    """Emit the cache's create call into ``bb``'s current function; returns the Relax var holding it.

    Arguments as ``create_paged_kv_cache``. The variant's scalar parameters are compiled in from
    ``params`` (or their defaults); variants with tensor parameters are refused, since a model
    library has no per-call tensors to bind them to.
    """
    import tvm
    from tvm import relax as rx
    from tvm.s_tir import dlight as dl
    from tvm.target import Target

    from attngen.codegen.cpu.merge_tir import merge_functions
    from attngen.codegen.cpu.tvm_cache_kernels import _programs
    from attngen.codegen.cpu.tvm_slots import check_slot_variant, lower_slot, slot_specs
    from attngen.ir import TensorParam
    from attngen.schedules.build_config import DTYPE_SHORT
    from attngen.variants import builtin

    from .params import resolve_params

    variant = variant if variant is not None else builtin("vanilla")
    check_slot_variant(variant)
    tensors = [p.name for p in variant.params if isinstance(p, TensorParam)]
    if tensors:
        raise ValueError(f"variant '{variant.name}': tensor parameters {tensors} cannot be compiled into a model "
                         "library; use create_paged_kv_cache (run-time binding) for this variant")
    kinds = _check_cache_args(num_layers=num_layers, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                              page_size=page_size, max_batch=max_batch, max_total_tokens=max_total_tokens,
                              prefill_chunk=prefill_chunk, attn_kinds=attn_kinds,
                              support_sliding_window=support_sliding_window)
    mode = _rope_mode(rope_mode)
    inline = mode == ROPE_MODES["inline"] or (support_sliding_window and mode != ROPE_MODES["none"])
    values = resolve_params(variant, params, num_qo_heads=num_qo_heads, batch_size=max_batch)
    scalars = {p.name: v for p, v in zip(variant.params, values)}
    window = sliding_window if "mha_sliding" in kinds else 0
    specs = slot_specs(variant, head_dim, dtype, inline_rope=inline, window=window)

    def add(func, name):
        return bb.add_func(func.without_attr("global_symbol") if func.attrs and "global_symbol" in func.attrs
                           else func, name)

    slots = {role: add(lower_slot(specs[role], variant, scalars), f"{name_prefix}_{role}") for role in SLOT_ROLES}
    merge = add(merge_functions(dtype)[f"merge_state_inplace_{DTYPE_SHORT[dtype]}"], f"{name_prefix}_merge_state")
    programs = _programs(num_layers=num_layers, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                         head_dim=head_dim, dtype=dtype, page_size=page_size, rope_scale=float(rope_scale),
                         rope_theta=float(rope_theta))
    with Target({"kind": "llvm"}):  # scheduled as TVM schedules them for a CPU target
        scheduled = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(
            tvm.IRModule({tvm.ir.GlobalVar(role): f for role, f in programs.items()}))
    helpers = {role: add(scheduled[role], f"{name_prefix}_tvm_{role}") for role in programs}
    return emit_create_call(
        bb, sizes=[max_batch, max_total_tokens, prefill_chunk, page_size, int(support_sliding_window),
                   sliding_window], num_layers=num_layers, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, kinds=kinds, rope_mode=mode, rope_scale=rope_scale, rope_theta=rope_theta, dtype=dtype,
        helpers=helpers, slots=[rx.Tuple([tvm.ir.StringImm("tirx"), slots[role]]) for role in SLOT_ROLES],
        merge=merge)


def emit_create_call(bb, *, sizes: list, num_layers: int, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                     kinds: list, rope_mode: int, rope_scale: float, rope_theta: float, dtype: str, helpers: dict,
                     slots: list, merge):
    """Emit ``vm.builtin.paged_attention_kv_cache_create`` into ``bb``: ``sizes`` = [max batch, max tokens,
    prefill chunk, page size, per-sequence sliding windows on?, per-layer window], ``helpers`` TVM's
    data-moving kernels by role, ``slots`` the five attention slot tuples (ragged prefill, paged prefill,
    decode, and the sliding-window prefill and decode), ``merge`` the merge function."""
    from tvm import relax as rx

    args = [
        rx.ShapeExpr(sizes), rx.ShapeExpr([0, num_layers]), rx.prim_value(num_qo_heads),
        rx.prim_value(num_kv_heads), rx.prim_value(head_dim), rx.prim_value(head_dim),
        rx.ShapeExpr([ATTN_KINDS[k] for k in kinds]), rx.prim_value(False), rx.prim_value(rope_mode),
        rx.prim_value(float(rope_scale)), rx.prim_value(float(rope_theta)), rx.op.null_value(),
        rx.op.zeros((), dtype), helpers["transpose_append"], rx.op.null_value(),  # no MLA append
        *slots,
        rx.Tuple([]), rx.Tuple([]), rx.Tuple([]),  # token-tree attention (paged, ragged) and MLA: not served
        rx.Tuple([merge]), helpers["split_rotary"], helpers["copy_single_page"], helpers["debug_get_kv"],
        helpers["compact_copy"],
    ]
    return bb.emit(rx.call_pure_packed("vm.builtin.paged_attention_kv_cache_create", *args, ty_args=rx.AnyType()))


def paged_kv_cache_module(variant=None, **kwargs):
    """An IRModule whose Relax function ``create_kv_cache()`` returns the cache (arguments as
    ``emit_paged_kv_cache``)."""
    from tvm import relax as rx

    bb = rx.BlockBuilder()
    with bb.function("create_kv_cache", []):
        bb.emit_func_output(emit_paged_kv_cache(bb, variant, **kwargs))
    return bb.get()


def export_model_library(mod, path: str | Path) -> Path:
    """Compile a model IRModule holding attngen's kernels for the CPU and export it as a shared library."""
    import tvm
    from tvm.target import Target

    path = Path(path)
    with tvm.transform.PassContext(config=BUILD_CONFIG):
        executable = tvm.compile(mod, target=Target({"kind": "llvm"}))
    executable.export_library(str(path))
    return path
