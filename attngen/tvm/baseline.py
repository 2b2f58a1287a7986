"""The baseline a CUDA cache with attngen's slots is measured against: the same PagedKVCache with TVM's own
TIR CUDA attention and merge kernels in every slot (what TVM's ``TIRPagedKVCache`` builds), for tests and
benchmarks."""
from __future__ import annotations

from .create_call import CacheParts, create_cache
from .helper_kernels import device_target, helper_functions
from .shape import CacheShape


def create_tvm_tir_cache_cuda(shape: CacheShape, device_id: int = 0):
    """A CUDA PagedKVCache of ``shape`` (no sliding windows) built from TVM's own kernels alone."""
    import tvm
    from tvm.relax.frontend.nn.llm import kv_cache as kvc

    from attngen.runtime.cuda import current_arch

    if shape.support_sliding_window or "mha_sliding" in shape.attn_kinds:
        raise ValueError("the TVM baseline cache is built without sliding-window kernels; use a shape without "
                         "sliding windows")
    target = device_target("cuda", current_arch())
    hkv, hq, d, dt = shape.num_kv_heads, shape.num_qo_heads, shape.head_dim, shape.dtype
    programs = {"ragged": kvc._attention_prefill_ragged(hkv, hq, d, d, dt, {}, target),
                "prefill": kvc._attention_prefill(hkv, hq, d, dt, False, {}, target),
                "decode": kvc._attention_decode(hkv, hq, d, dt, False, {}, target),
                "merge": kvc._merge_state_inplace(hq, d, dt, target)}
    mod = tvm.IRModule({tvm.ir.GlobalVar(f"tvm_{r}"): f.with_attr("global_symbol", f"tvm_{r}")
                        for r, f in programs.items()})
    with target:
        lib = tvm.tirx.build(mod, target=target)
    f = {r: lib[f"tvm_{r}"] for r in programs}
    # TVM never calls the sliding-window slots here: they hold the paged prefill and decode kernels
    attention = {"prefill_ragged": ("tirx", f["ragged"]), "prefill": ("tirx", f["prefill"]),
                 "decode": ("tirx", f["decode"]), "prefill_sliding_window": ("tirx", f["prefill"]),
                 "decode_sliding_window": ("tirx", f["decode"])}
    parts = CacheParts(attention=attention, helpers=helper_functions(shape, target), merge=f["merge"])
    return create_cache(shape, parts, tvm.cuda(device_id))
