"""A CPU PagedKVCache's attngen kernels: the ("tirx", fn) attention slots and the merge slot.

- ``merge_slot_function``: the merge slot. TVM calls it as ``f(o, lse, o_other, lse_other)``
  with o [n, H, D] and lse [n, H] float32 in base 2, merging in place; attngen's CPU merge
  has exactly that calling convention and also accepts TVM's -5e4 "no key" lse as well as -inf.
- ``attention_slot_functions``: the seven ``("tirx", fn)`` attention slots (ragged prefill,
  paged prefill, decode, their sliding-window forms, and the ragged and paged token-tree
  prefills of speculative decoding) for a variant, built by the CPU
  backend (:mod:`attngen.codegen.cpu.tvm_slots` says what they compute). The variant's scalar
  parameters are compiled in, its tensor parameters bound to every call.
- ``CPUBackend``: those kernels for a cache created at run time (built libraries) and ahead of
  time (PrimFuncs of the model, the variant's hooks inlined; tensor parameters become constants of the
  model, bound to the slots by the model's own binding function: bind_params.py), and the export of a
  model library by LLVM.

The variant's hooks see TVM's token positions; TVM's ``causal`` flag and sliding windows apply on
top of the variant's own mask.
"""
from __future__ import annotations

from pathlib import Path

from attngen.build import support_library
from attngen.codegen.cpu.merge_tir import CPU_MERGE_DTYPES, merge_functions
from attngen.codegen.cpu.tvm_slots import build_slot_library, check_slot_variant, lower_slot, slot_specs
from attngen.schedules.build_config import merge_symbol
from attngen.variants import builtin

from .bind_params import emit_bound_slots, host_values
from .bind_params import static_library as bind_static_library
from .create_call import SLOT_ROLES, TREE_ROLES, CacheParts
from .cuda_link import create_shared_with_libstdcxx
from .helper_kernels import add_helpers, device_target, helper_functions
from .loading import load_library
from .shape import CacheShape
from .slot_params import bind_trailing, split_params

# the common-subexpression pass binds float subexpressions of the inlined hooks in a way LLVM's
# lowering rejects (see attngen/codegen/cpu/build.py); every build of these kernels turns it off
MODEL_BUILD_CONFIG = {"tirx.disable_cse_tir": True}


def merge_slot_function(dtype: str = "float32"):
    """The function to pass in the create call's merge tuple, e.g. ``[merge_slot_function("float32")]``."""
    if dtype not in CPU_MERGE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: the CPU merge slot serves {list(CPU_MERGE_DTYPES)}")
    return load_library(support_library("merge_cpu"))[merge_symbol("merge_state_inplace", dtype)]


def _check_target(target: str) -> None:
    if target == "cuda":
        raise NotImplementedError(
            "target='cuda': attention_slot_functions builds the CPU slots; for a CUDA cache call "
            "create_paged_kv_cache(..., target='cuda') (attngen.tvm)")
    if target != "cpu":
        raise ValueError(f"target {target!r}: attngen fills TVM PagedKVCache slots for target='cpu' or 'cuda'")


def attention_slot_functions(shape: CacheShape, variant=None, *, params: dict | None = None, target: str = "cpu",
                             cache=None) -> dict:
    """Role -> function for the create call's seven attention slots of a cache of ``shape`` (``SLOT_ROLES`` and
    ``TREE_ROLES``; wrap each as ``["tirx", fn]``); ``variant`` defaults to vanilla, ``params`` gives its
    parameters' values."""
    import tvm

    _check_target(target)
    variant = variant if variant is not None else builtin("vanilla")
    check_slot_variant(variant)
    scalars, values = split_params(variant, params, shape)
    tensors = [tvm.runtime.tensor(a, device=tvm.cpu()) for a in host_values(variant, values)]
    specs = slot_specs(variant, shape.head_dim, shape.dtype, inline_rope=shape.inline_rope,
                       window=shape.layer_window)
    kwargs = {"cache": cache} if cache is not None else {}
    library = load_library(build_slot_library(variant, specs, scalars, **kwargs))
    out = {}
    for role in SLOT_ROLES + TREE_ROLES:
        fn = library[specs[role].func_name]
        out[role] = bind_trailing(fn, tensors) if tensors else fn
    return out


class CPUBackend:
    """The CPU's part of a cache: run time, ahead of time, and the model library's export."""

    def check(self, shape: CacheShape, convention: str) -> None:
        if convention != "tirx":
            raise ValueError(f"convention {convention!r}: the CPU slots serve the 'tirx' convention only")

    def runtime_parts(self, variant, shape: CacheShape, *, params, convention: str, cache):
        """(the cache's functions, built for this process, and the device the cache lives on)."""
        import tvm

        slots = attention_slot_functions(shape, variant, params=params, cache=cache)
        parts = CacheParts(attention={role: ("tirx", slots[role]) for role in SLOT_ROLES + TREE_ROLES},
                           helpers=helper_functions(shape, device_target("cpu"), cache),
                           merge=merge_slot_function(shape.dtype))
        return parts, tvm.cpu()

    def model_parts(self, bb, variant, shape: CacheShape, *, params, convention: str, arch, name_prefix: str,
                    cache):
        """(the cache's functions as PrimFuncs added to ``bb``'s module, [the tensor-parameter binding's object, for
        a variant that has them])."""
        check_slot_variant(variant)
        scalars, values = split_params(variant, params, shape)
        specs = slot_specs(variant, shape.head_dim, shape.dtype, inline_rope=shape.inline_rope,
                           window=shape.layer_window)

        def add(func, name):
            return bb.add_func(func.without_attr("global_symbol") if func.attrs and "global_symbol" in func.attrs
                               else func, name)

        merge = merge_functions(shape.dtype)[merge_symbol("merge_state_inplace", shape.dtype)]
        attention = {role: ("tirx", add(lower_slot(specs[role], variant, scalars), f"{name_prefix}_{role}"))
                     for role in SLOT_ROLES + TREE_ROLES}
        external = []
        if values:  # the tensors as constants of the model, bound to the slots by the model's own binding function
            attention = emit_bound_slots(bb, attention, host_values(variant, values), name_prefix)
            external.append(bind_static_library(name_prefix, cache))
        parts = CacheParts(attention=attention, merge=add(merge, f"{name_prefix}_merge_state"),
                           # scheduled as TVM schedules them for a CPU target
                           helpers=add_helpers(bb, shape, device_target("cpu"), name_prefix))
        return parts, external

    def export(self, mod, path: str | Path, arch: str | None) -> Path:
        """Compile a model IRModule holding attngen's kernels for the CPU and export it as a shared library."""
        import tvm

        path = Path(path)
        with tvm.transform.PassContext(config=MODEL_BUILD_CONFIG):
            executable = tvm.compile(mod, target=device_target("cpu"))
        # (a tensor-parameter binding in the model is C++: the link names the shared C++ runtime)
        executable.export_library(str(path), fcompile=create_shared_with_libstdcxx)
        return path
