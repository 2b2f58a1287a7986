"""TVM PagedKVCache on a CUDA GPU with attngen's attention: the ("tirx", fn) slots from the CUDA library.

``cuda_slot_functions`` builds (cached) the variant's CUDA library with ``kernels=("tvm",)``
(codegen/cuda_tvm_slots.py says what the functions compute and what they refuse) and
returns the slot functions; ``tvm_cuda_kernels`` builds TVM's own data-moving kernels
(append, page copy, compaction, debug read, split + RoPE) for the GPU the way TVM's
``TIRPagedKVCache`` schedules them; ``create_paged_kv_cache_cuda`` assembles a cache whose
attention slots and merge slot are attngen's. Created through
``tvm_kv_cache.create_paged_kv_cache(..., target="cuda")``.
"""
from __future__ import annotations

from attngen.schedules.build_config import DTYPE_SHORT, symbol

CUDA_DTYPES = ("float16", "bfloat16")


def build_slot_library(variant, *, head_dim: int, dtype: str, params: dict | None, arch: str, cache=None):
    """Build (cached) the variant's CUDA library with kernels=("tvm",), the scalar ``params`` compiled in;
    returns the pipeline's BuildResult."""
    from attngen.codegen.pipeline import run_pipeline
    from attngen.ir import ScalarParam
    from attngen.schedules.build_config import BuildConfig

    if dtype not in CUDA_DTYPES:
        raise ValueError(f"dtype {dtype!r}: the CUDA slots serve {list(CUDA_DTYPES)}")
    names = {p.name for p in variant.params if isinstance(p, ScalarParam)}
    unknown = sorted(set(params or {}) - names)
    if unknown:
        raise ValueError(f"params: {unknown} are not scalar parameters of variant '{variant.name}'")
    cfg = BuildConfig("cuda", (head_dim,), (dtype,), (arch,), ("HND",), kernels=("tvm",),
                      tvm_constants=tuple(sorted((params or {}).items())))
    return run_pipeline(variant, cfg, **({"cache": cache} if cache is not None else {}))


def cuda_slot_functions(variant, *, head_dim: int, dtype: str, params: dict | None = None, arch: str | None = None,
                        cache=None) -> dict:
    """Role -> function for the ("tirx", fn) slots TVM calls ("prefill_ragged", "prefill", "decode"), and
    role -> (run, plan) for the ("flashinfer", run, plan) ones ("fi_prefill_ragged", "fi_prefill", "fi_decode")."""
    import tvm_ffi

    from .cuda import current_arch

    built = build_slot_library(variant, head_dim=head_dim, dtype=dtype, params=params, arch=arch or current_arch(),
                               cache=cache)
    lib = tvm_ffi.load_module(str(built.library))
    fi = {k: lib[symbol(f"tvm_fi_{k}", dtype, head_dim)]
          for k in ("decode_plan", "decode_run", "prefill_plan", "prefill_paged_run", "prefill_ragged_run")}
    return {"prefill_ragged": lib[symbol("tvm_prefill_ragged", dtype, head_dim)],
            "prefill": lib[symbol("tvm_prefill_paged", dtype, head_dim)],
            "decode": lib[symbol("tvm_decode", dtype, head_dim)],
            # ("flashinfer", run, plan) triples
            "fi_prefill_ragged": (fi["prefill_ragged_run"], fi["prefill_plan"]),
            "fi_prefill": (fi["prefill_paged_run"], fi["prefill_plan"]),
            "fi_decode": (fi["decode_run"], fi["decode_plan"])}


def tvm_cuda_programs(*, num_layers: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, dtype: str,
                      page_size: int, rope_scale: float, rope_theta: float, arch: str):
    """TVM's own PagedKVCache helper kernels (append, page copy, compaction, debug read, split + RoPE)
    scheduled for the GPU as TVM's ``TIRPagedKVCache`` schedules them: an IRModule of PrimFuncs
    ``tvm_<role>``, and the CUDA target."""
    import tvm
    from tvm.relax.frontend.nn.llm import kv_cache as kvc
    from tvm.s_tir import dlight as dl
    from tvm.target import Target

    target = Target({"kind": "cuda", "arch": arch}, host={"kind": "llvm"})
    programs = {
        "transpose_append": kvc._kv_cache_transpose_append(num_kv_heads, head_dim, dtype, page_size),
        "debug_get_kv": kvc._kv_cache_debug_get_kv(num_layers, num_kv_heads, head_dim, dtype),
        "split_rotary": kvc.llama_rope_with_position_map(rope_theta, rope_scale, head_dim, num_qo_heads,
                                                         num_kv_heads, dtype, {}),
        "copy_single_page": kvc._copy_single_page(num_kv_heads, page_size, head_dim, dtype, target),
        "compact_copy": kvc._compact_kv_copy(num_kv_heads, head_dim, dtype, target, page_size),
    }
    mod = tvm.IRModule({tvm.ir.GlobalVar(f"tvm_{r}"): f.with_attr("global_symbol", f"tvm_{r}")
                        for r, f in programs.items()})
    with target:
        mod = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(mod)
    return mod, target


def tvm_cuda_kernels(**shape) -> dict:
    """TVM's own PagedKVCache helper kernels for the GPU, built by TVM: role -> function (arguments as
    ``tvm_cuda_programs``)."""
    import tvm

    mod, target = tvm_cuda_programs(**shape)
    with target:
        lib = tvm.tirx.build(mod, target=target)
    return {gv.name_hint[len("tvm_"):]: lib[gv.name_hint] for gv in mod.get_global_vars()}


def _create(*, main_slots: list, sliding_slots: list, merge, num_layers: int, num_qo_heads: int,
            num_kv_heads: int, head_dim: int, dtype: str, page_size: int, max_batch: int, max_total_tokens: int,
            prefill_chunk: int, kinds: list, rope_mode: int, rope_scale: float, rope_theta: float, arch: str,
            device_id: int):
    """The create call of a CUDA cache: ``main_slots`` fill the ragged prefill, paged prefill and decode slots,
    ``sliding_slots`` the sliding-window prefill and decode ones; TVM's own kernels move the data."""
    import tvm

    from .tvm_kv_cache import PLACEHOLDER_WINDOW, create_call

    k = tvm_cuda_kernels(num_layers=num_layers, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                         head_dim=head_dim, dtype=dtype, page_size=page_size, rope_scale=float(rope_scale),
                         rope_theta=float(rope_theta), arch=arch)
    return create_call(sizes=[max_batch, max_total_tokens, prefill_chunk, page_size, 0, PLACEHOLDER_WINDOW],
                       num_layers=num_layers, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, kinds=kinds, rope_mode=rope_mode, rope_scale=rope_scale,
                       rope_theta=rope_theta, dtype_token=tvm.runtime.empty((), dtype, device=tvm.cuda(device_id)),
                       helpers=k, slots=[*main_slots, *sliding_slots], merge=merge)


def check_cuda_cache_args(*, convention: str, rope_mode: int, kinds: list) -> None:
    """Refuse what attngen's CUDA slots cannot serve (for the run-time and the model-library cache alike)."""
    from .tvm_kv_cache import ROPE_MODES

    if convention not in ("tirx", "flashinfer"):
        raise ValueError(f"convention {convention!r}: use 'tirx' or 'flashinfer'")
    if rope_mode == ROPE_MODES["inline"]:
        raise ValueError("rope_mode 'inline': attngen's CUDA slots do not apply RoPE inside attention; use "
                         "rope_mode='normal' (TVM's split + RoPE kernel before the cache) or 'none'")
    if "mha_sliding" in kinds:
        raise ValueError("attn_kinds 'mha_sliding': attngen's CUDA slots do not serve sliding-window layers yet")


def create_paged_kv_cache_cuda(variant, *, num_layers: int, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                               dtype: str, page_size: int, max_batch: int, max_total_tokens: int,
                               prefill_chunk: int, rope_mode: int, rope_scale: float, rope_theta: float,
                               kinds: list, params: dict | None, cache=None, device_id: int = 0,
                               convention: str = "tirx"):
    """``convention``: "tirx" (one function per slot, even split-KV in decode) or "flashinfer" (run + plan:
    TVM plans once per step on the host, the decode plan is attngen's load-balanced work list)."""
    from .cuda import current_arch
    from .state import _cuda_library

    check_cuda_cache_args(convention=convention, rope_mode=rope_mode, kinds=kinds)
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("target='cuda': this machine has no CUDA GPU (or torch has no CUDA); use target='cpu'")
    arch = current_arch()
    slots = cuda_slot_functions(variant, head_dim=head_dim, dtype=dtype, params=params, arch=arch, cache=cache)
    if convention == "tirx":
        main_slots = [["tirx", slots[r]] for r in ("prefill_ragged", "prefill", "decode")]
    else:
        main_slots = [["flashinfer", *slots[f"fi_{r}"]] for r in ("prefill_ragged", "prefill", "decode")]
    # TVM never calls the sliding-window slots here: sliding layers and per-sequence windows are refused above
    return _create(main_slots=main_slots, sliding_slots=[["tirx", slots["prefill"]], ["tirx", slots["decode"]]],
                   merge=_cuda_library(arch)[f"merge_state_inplace_{DTYPE_SHORT[dtype]}"], num_layers=num_layers,
                   num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                   page_size=page_size, max_batch=max_batch, max_total_tokens=max_total_tokens,
                   prefill_chunk=prefill_chunk, kinds=kinds, rope_mode=rope_mode, rope_scale=rope_scale,
                   rope_theta=rope_theta, arch=arch, device_id=device_id)


def create_tvm_tir_cache_cuda(*, num_layers: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, dtype: str,
                              page_size: int, max_batch: int, max_total_tokens: int, prefill_chunk: int,
                              device_id: int = 0):
    """The baseline: the same cache with TVM's own TIR CUDA attention and merge kernels in every slot
    (what TVM's ``TIRPagedKVCache`` builds), for tests and benchmarks of attngen's slots against it."""
    import tvm
    from tvm.relax.frontend.nn.llm import kv_cache as kvc
    from tvm.target import Target

    from .cuda import current_arch

    arch = current_arch()
    target = Target({"kind": "cuda", "arch": arch}, host={"kind": "llvm"})
    programs = {"ragged": kvc._attention_prefill_ragged(num_kv_heads, num_qo_heads, head_dim, head_dim, dtype, {},
                                                        target),
                "prefill": kvc._attention_prefill(num_kv_heads, num_qo_heads, head_dim, dtype, False, {}, target),
                "decode": kvc._attention_decode(num_kv_heads, num_qo_heads, head_dim, dtype, False, {}, target),
                "merge": kvc._merge_state_inplace(num_qo_heads, head_dim, dtype, target)}
    mod = tvm.IRModule({tvm.ir.GlobalVar(f"tvm_{r}"): f.with_attr("global_symbol", f"tvm_{r}")
                        for r, f in programs.items()})
    with target:
        lib = tvm.tirx.build(mod, target=target)
    f = {r: lib[f"tvm_{r}"] for r in programs}
    return _create(main_slots=[["tirx", f[r]] for r in ("ragged", "prefill", "decode")],
                   sliding_slots=[["tirx", f["prefill"]], ["tirx", f["decode"]]], merge=f["merge"],
                   num_layers=num_layers, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                   dtype=dtype, page_size=page_size, max_batch=max_batch, max_total_tokens=max_total_tokens,
                   prefill_chunk=prefill_chunk, kinds=["mha"] * num_layers, rope_mode=0, rope_scale=1.0,
                   rope_theta=1e4, arch=arch, device_id=device_id)
