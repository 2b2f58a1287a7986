"""attngen.tvm: TVM's PagedKVCache (``vm.builtin.paged_attention_kv_cache_create``) with attngen's attention.

A :class:`CacheShape` says what the cache is (sizes, heads, dtype, RoPE, sliding windows);
``create_paged_kv_cache`` creates one in this process (CPU or this machine's GPU) whose attention
slots run a variant and whose merge slot is attngen's; ``paged_kv_cache_module`` /
``emit_paged_kv_cache`` put the same kernels into a TVM model (PrimFuncs on the CPU, one statically
linked object file on CUDA) that ``export_model_library`` compiles, so the Relax VM creates the
cache from the model library alone.

Modules: ``shape`` (CacheShape), ``create_call`` (the create call's argument list, at run time and
in Relax), ``cache`` (the core), ``cpu`` / ``cuda`` (each device's kernels), ``helper_kernels``
(TVM's own data-moving kernels), ``cuda_link`` (linking a CUDA model library), ``baseline`` (caches of TVM's own
kernels, CUDA and CPU, to compare with).
"""
from .cache import EmittedCache, create_paged_kv_cache, emit_paged_kv_cache, export_model_library, paged_kv_cache_module
from .cpu import attention_slot_functions, merge_slot_function
from .create_call import SLOT_ROLES, TREE_ROLES, CacheParts
from .shape import ATTN_KINDS, ROPE_MODES, CacheShape, UnsupportedCacheFeature

__all__ = ["ATTN_KINDS", "CacheParts", "CacheShape", "EmittedCache", "ROPE_MODES", "SLOT_ROLES", "TREE_ROLES",
           "attention_slot_functions", "create_paged_kv_cache", "emit_paged_kv_cache", "export_model_library",
           "merge_slot_function", "paged_kv_cache_module", "UnsupportedCacheFeature"]
