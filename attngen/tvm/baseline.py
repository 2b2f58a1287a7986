"""The baselines a cache with attngen's slots is compared with: the same PagedKVCache with TVM's own TIR
attention and merge kernels in every slot (what TVM's ``TIRPagedKVCache`` builds), for tests and benchmarks.

- ``create_tvm_tir_cache_cuda``: on this machine's GPU, at run time (TVM's token-tree kernels on request);
- ``emit_tvm_tir_cache_cuda``: TVM's CUDA kernels as PrimFuncs of a model, for a named arch. A shape with
  sliding windows gets TVM's sliding-window kernels in those slots (the prefill one with the shape's layer
  window compiled in); TVM's prefill kernel masks the window by in-call rows, which is right for a
  sequence's own pages but not for a prefix shared by forks;
- ``emit_tvm_tir_cache_cpu``: TVM's CPU kernels as PrimFuncs of a model, the cache's create call emitted
  into a Relax function. Unlike ``TIRPagedKVCache`` for an LLVM target, which passes its two token-tree
  kernels in each other's slots (TVM 0.27: the ragged kernel where the runtime calls the paged one, so
  a token-tree step fails on the argument count), every kernel sits in the slot the runtime calls it from.
"""
from __future__ import annotations

from .create_call import TREE_ROLES, CacheParts, create_cache, emit_create
from .helper_kernels import add_helpers, device_target, helper_functions
from .shape import CacheShape


def _has_windows(shape: CacheShape) -> bool:
    return shape.support_sliding_window or "mha_sliding" in shape.attn_kinds


def tvm_cuda_kernels(shape: CacheShape, target, trees: bool = False) -> dict:
    """Role ("prefill_ragged", "prefill", "decode", "merge", for a shape with sliding windows
    "prefill_sliding_window", "decode_sliding_window", and with ``trees`` the two token-tree slots) -> TVM's own
    CUDA PrimFunc for a cache of ``shape``, scheduled for ``target``."""
    from tvm.relax.frontend.nn.llm import kv_cache as kvc

    hkv, hq, d, dt, ps = shape.num_kv_heads, shape.num_qo_heads, shape.head_dim, shape.dtype, shape.page_size
    kernels = {"prefill_ragged": kvc._attention_prefill_ragged(hkv, hq, d, d, dt, {}, target),
               "prefill": kvc._attention_prefill(hkv, hq, d, dt, False, {}, target, page_size=ps),
               "decode": kvc._attention_decode(hkv, hq, d, dt, False, {}, target, page_size=ps),
               "merge": kvc._merge_state_inplace(hq, d, dt, target)}
    if _has_windows(shape):
        kernels["prefill_sliding_window"] = kvc._attention_prefill(
            hkv, hq, d, dt, True, {}, target, page_size=ps, sliding_window_size=shape.sliding_window)
        kernels["decode_sliding_window"] = kvc._attention_decode(hkv, hq, d, dt, True, {}, target, page_size=ps)
    if trees:
        kernels["prefill_tree_mask_paged"] = kvc.tree_attn_with_paged_kv_cache(hkv, hq, d, dt, {}, target)
        kernels["prefill_tree_mask"] = kvc.tree_attn(hkv, hq, d, dt, {}, target)
    return kernels


def _cuda_attention(f: dict) -> dict:
    # without windows TVM never calls the sliding-window slots: they hold the paged prefill and decode kernels
    trees = {role: ("tirx", f[role]) for role in TREE_ROLES if role in f}
    return {"prefill_ragged": ("tirx", f["prefill_ragged"]), "prefill": ("tirx", f["prefill"]),
            "decode": ("tirx", f["decode"]),
            "prefill_sliding_window": ("tirx", f.get("prefill_sliding_window", f["prefill"])),
            "decode_sliding_window": ("tirx", f.get("decode_sliding_window", f["decode"]))} | trees


def create_tvm_tir_cache_cuda(shape: CacheShape, device_id: int = 0, trees: bool = False):
    """A CUDA PagedKVCache of ``shape`` built from TVM's own kernels alone (with ``trees``, its token-tree
    kernels too)."""
    import tvm

    from attngen.runtime.cuda import current_arch

    target = device_target("cuda", current_arch())
    programs = tvm_cuda_kernels(shape, target, trees)
    mod = tvm.IRModule({tvm.ir.GlobalVar(f"tvm_{r}"): f.with_attr("global_symbol", f"tvm_{r}")
                        for r, f in programs.items()})
    with target:
        lib = tvm.tirx.build(mod, target=target)
    f = {r: lib[f"tvm_{r}"] for r in programs}
    parts = CacheParts(attention=_cuda_attention(f), helpers=helper_functions(shape, target), merge=f["merge"])
    return create_cache(shape, parts, tvm.cuda(device_id))


def emit_tvm_tir_cache_cuda(bb, shape: CacheShape, arch: str, name_prefix: str = "tvm_tir", trees: bool = False):
    """Emit into ``bb``'s current function the create call of a CUDA cache of ``shape`` whose every kernel is TVM's
    own, scheduled for ``arch``, as PrimFuncs of the model; returns the Relax var holding the cache. (Its token-tree
    slots stay empty unless ``trees``.)"""
    target = device_target("cuda", arch)
    kernels = {role: bb.add_func(_without_symbol(f), f"{name_prefix}_{role}")
               for role, f in tvm_cuda_kernels(shape, target, trees).items()}
    parts = CacheParts(attention=_cuda_attention(kernels), merge=kernels["merge"],
                       helpers=add_helpers(bb, shape, target, name_prefix))
    return emit_create(bb, shape, parts)


def _without_symbol(func):
    return func.without_attr("global_symbol") if func.attrs and "global_symbol" in func.attrs else func


def tvm_cpu_kernels(shape: CacheShape) -> dict:
    """Role (the create call's attention slots, and "merge") -> TVM's own CPU PrimFunc for a cache of ``shape``."""
    from tvm.relax.frontend.nn.llm import kv_cache as kvc

    hkv, hq, d, dt, rs = shape.num_kv_heads, shape.num_qo_heads, shape.head_dim, shape.dtype, {}
    return {"prefill_ragged": kvc._attention_prefill_ragged_cpu(hkv, hq, d, d, dt, rs),
            "prefill": kvc._attention_prefill_cpu(hkv, hq, d, dt, False, rs),
            "decode": kvc._attention_decode_cpu(hkv, hq, d, dt, False, rs),
            "prefill_sliding_window": kvc._attention_prefill_cpu(hkv, hq, d, dt, True, rs,
                                                                 sliding_window_size=shape.sliding_window),
            "decode_sliding_window": kvc._attention_decode_cpu(hkv, hq, d, dt, True, rs),
            "prefill_tree_mask_paged": kvc.tree_attn_with_paged_kv_cache_cpu(hkv, hq, d, dt, rs),
            "prefill_tree_mask": kvc.tree_attn_cpu(hkv, hq, d, dt, rs),
            "merge": kvc._merge_state_inplace_cpu(dt)}


def emit_tvm_tir_cache_cpu(bb, shape: CacheShape, name_prefix: str = "tvm_tir"):
    """Emit into ``bb``'s current function the create call of a CPU cache of ``shape`` whose every kernel is TVM's
    own; returns the Relax var holding the cache. (TVM's CPU tree kernels assume 16-token pages.)"""
    kernels = {role: bb.add_func(_without_symbol(f), f"{name_prefix}_{role}")
               for role, f in tvm_cpu_kernels(shape).items()}
    merge = kernels.pop("merge")
    parts = CacheParts(attention={role: ("tirx", f) for role, f in kernels.items()}, merge=merge,
                       helpers=add_helpers(bb, shape, device_target("cpu"), name_prefix))
    return emit_create(bb, shape, parts)
