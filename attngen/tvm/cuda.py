"""A CUDA PagedKVCache's attngen kernels: the CUDA library's TVM-convention functions and the CUDA merge.

``build_slot_library`` builds (cached) the variant's CUDA library with ``kernels=("tvm",)``
(codegen/cuda_tvm_slots.py and csrc/tvm_slots.h say what the functions compute and what they
refuse) through :func:`attngen.build.build`; ``cuda_slot_functions`` loads its functions, and
``slot_object`` joins them, the merge kernels and the CUDA runtime into one object file for static
linking into a model library (codegen/cuda_object.py). ``CUDABackend`` fills a cache with them at
run time (functions of the loaded library) and ahead of time (``ExternFunc``s of the object, which
``tvm.compile`` + export link into the model, the way TVM links FlashInfer). Two slot conventions:
"tirx" (one function per slot, even split-KV in decode) and "flashinfer" (run + plan: TVM plans
once per step on the host, the decode plan is attngen's load-balanced work list). The two
sliding-window slots and the two token-tree slots (speculative decoding) are "tirx" functions in both
(as in TVM's own FlashInfer cache, and TVM 0.27 converts tree slots of that form only); a cache with
windows (per-sequence windows with sinks, or "mha_sliding" layers) gets a library built for them
(``slot_window``: ``BuildConfig.tvm_window``), any other a library whose sliding-window functions
refuse a call (TVM never makes one there). A cache whose RoPE TVM applies inside attention (``inline_rope``:
RopeMode INLINE, or any RoPE with per-sequence windows) gets a library built with ``BuildConfig.tvm_rope``, in
the "tirx" convention only (TVM passes the "flashinfer" run functions no positions).

The variant's parameters (slot_params.py): scalars compiled into the build. Tensor parameters, at run time,
become tvm tensors on the cache's GPU (``device_tensor``: a torch CUDA tensor there is shared, so in-place
changes reach the next call) bound as trailing arguments of every "tirx" function and "flashinfer" run
function (``bind_tensor_params``); the C++ checks them per call. In a model library they are constants of the
model, copied to the GPU at the first call and bound by the model's own binding function (bind_params.py).
"""
from __future__ import annotations

from pathlib import Path

from attngen.build import build, support_library
from attngen.codegen.cuda_object import build_slot_object
from attngen.codegen.cuda_tvm_slots import check_tvm_slot_hooks, tvm_slot_functions
from attngen.ir import ScalarParam
from attngen.schedules.arch import arch_spec
from attngen.schedules.build_config import BuildConfig, merge_symbol, symbol

from .bind_params import UNPREFIXED, bind_function_name, bind_object, emit_bound_slots, host_values
from .create_call import SLOT_ROLES, TREE_ROLES, CacheParts
from .cuda_link import export_cuda_model_library
from .helper_kernels import add_helpers, device_target, helper_functions
from .loading import load_library
from .shape import ROPE_MODES, CacheShape
from .slot_params import bind_trailing, given_scalars, split_params

CUDA_DTYPES = ("float16", "bfloat16")
CONVENTIONS = ("tirx", "flashinfer")
# role -> the exported kind of its ("tirx", fn) function, or of its ("flashinfer", run, plan) pair ("fi_" roles)
SLOT_FUNCTION_KINDS = {
    "prefill_ragged": "tvm_prefill_ragged", "prefill": "tvm_prefill_paged", "decode": "tvm_decode",
    "prefill_sliding_window": "tvm_prefill_paged_sliding_window", "decode_sliding_window": "tvm_decode_sliding_window",
    "prefill_tree_mask": "tvm_prefill_ragged_tree", "prefill_tree_mask_paged": "tvm_prefill_paged_tree",
    "fi_prefill_ragged": ("tvm_fi_prefill_ragged_run", "tvm_fi_prefill_plan"),
    "fi_prefill": ("tvm_fi_prefill_paged_run", "tvm_fi_prefill_plan"),
    "fi_decode": ("tvm_fi_decode_run", "tvm_fi_decode_plan"),
}


def check_cuda_shape(shape: CacheShape, convention: str) -> None:
    """Refuse what attngen's CUDA slots cannot serve (for the run-time and the model-library cache alike)."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention {convention!r}: use 'tirx' or 'flashinfer'")
    if shape.inline_rope and convention != "tirx":
        mode = {code: name for name, code in ROPE_MODES.items()}[shape.rope_mode]
        why = "" if shape.rope_mode == ROPE_MODES["inline"] else " (support_sliding_window=True makes it inline)"
        raise ValueError(f"rope_mode {mode!r}{why}: TVM applies this RoPE inside attention, and its \"flashinfer\" "
                         "run functions get no token positions to rotate at; use convention='tirx', whose CUDA "
                         "slots apply inline RoPE, or rope_mode='normal' without per-sequence windows")


def slot_window(shape: CacheShape) -> int | None:
    """What the sliding-window slots of a cache of ``shape`` serve (``BuildConfig.tvm_window``): the window of its
    "mha_sliding" layers, 0 for per-sequence windows (sinks), None where TVM never calls them."""
    if shape.layer_window:
        return shape.layer_window
    return 0 if shape.support_sliding_window else None


def build_slot_library(variant, *, head_dim: int, dtype: str, params: dict | None, arch: str, window: int | None = None,
                       rope: bool = False, cache=None):
    """Build (cached) the variant's CUDA library with kernels=("tvm",), the scalar ``params``, what the
    sliding-window slots serve (``window``, ``slot_window``) and whether the slots apply inline RoPE (``rope``:
    ``CacheShape.inline_rope``) compiled in; returns the build's BuildResult. Tensor parameters are no part of the
    build (nor of its cache key): its functions take them as trailing arguments."""
    if dtype not in CUDA_DTYPES:
        raise ValueError(f"dtype {dtype!r}: the CUDA slots serve {list(CUDA_DTYPES)}")
    names = {p.name for p in variant.params if isinstance(p, ScalarParam)}
    unknown = sorted(set(params or {}) - names)
    if unknown:
        raise ValueError(f"params: {unknown} are not scalar parameters of variant '{variant.name}'")
    cfg = BuildConfig("cuda", (head_dim,), (dtype,), (arch,), ("HND",), kernels=("tvm",),
                      tvm_constants=tuple(sorted((params or {}).items())), tvm_window=window, tvm_rope=rope)
    return build(variant, cfg, **({"cache": cache} if cache is not None else {}))


def slot_roles(lookup) -> dict:
    """Role (``SLOT_FUNCTION_KINDS``) -> ``lookup(exported kind)``, or a (run, plan) pair of them."""
    return {role: tuple(map(lookup, kinds)) if isinstance(kinds, tuple) else lookup(kinds)
            for role, kinds in SLOT_FUNCTION_KINDS.items()}


def attention_entries(roles: dict, convention: str) -> dict:
    """The create call's seven attention slots (``SLOT_ROLES``, ``TREE_ROLES``) from ``slot_roles``' functions."""
    main = ("prefill_ragged", "prefill", "decode")
    if convention == "tirx":
        entries = {role: ("tirx", roles[role]) for role in main}
    else:
        entries = {role: ("flashinfer", *roles[f"fi_{role}"]) for role in main}
    for role in ("prefill_sliding_window", "decode_sliding_window", *TREE_ROLES):  # "tirx" in both conventions
        entries[role] = ("tirx", roles[role])
    return {role: entries[role] for role in SLOT_ROLES + TREE_ROLES}


def cuda_slot_functions(variant, *, head_dim: int, dtype: str, params: dict | None = None, arch: str | None = None,
                        window: int | None = None, rope: bool = False, cache=None) -> dict:
    """Role -> function for the ("tirx", fn) slots TVM calls ("prefill_ragged", "prefill", "decode",
    "prefill_sliding_window", "decode_sliding_window": serving ``window``, see ``slot_window``), and role -> (run,
    plan) for the ("flashinfer", run, plan) ones ("fi_prefill_ragged", "fi_prefill", "fi_decode"). ``params``: the
    scalar parameters' values; a variant's tensor parameters are the functions' trailing arguments (unbound here:
    ``bind_tensor_params``)."""
    from attngen.runtime.cuda import current_arch

    built = build_slot_library(variant, head_dim=head_dim, dtype=dtype, params=params, arch=arch or current_arch(),
                               window=window, rope=rope, cache=cache)
    library = load_library(built.library)
    return slot_roles(lambda kind: library[symbol(kind, dtype, head_dim)])


def bind_tensor_params(roles: dict, tensors: list) -> dict:
    """``slot_roles``' functions with the variant's tensor parameters (tvm tensors on the cache's GPU, in
    declaration order) appended to TVM's arguments of every call: each "tirx" function and each "flashinfer" run
    function (the plans take none)."""
    if not tensors:
        return roles
    return {role: (bind_trailing(fn[0], tensors), fn[1]) if isinstance(fn, tuple) else bind_trailing(fn, tensors)
            for role, fn in roles.items()}


def device_tensor(value, name: str, device):
    """A tensor parameter's value as a tvm tensor on the cache's GPU ``device``: a torch CUDA tensor on that GPU is
    shared (no copy: its later in-place changes reach the next call), any other value copied there once."""
    import numpy as np
    import tvm

    if hasattr(value, "__dlpack__") and hasattr(value, "detach"):  # torch
        if value.device.type == "cuda" and value.device.index != device.index:
            raise ValueError(f"params['{name}']: on {value.device}, the cache on cuda:{device.index}; give the "
                             "parameter on the cache's GPU")
        if value.device.type != "cuda":
            value = value.to(f"cuda:{device.index}")
        return tvm.runtime.from_dlpack(value.detach())
    return tvm.runtime.tensor(np.ascontiguousarray(np.asarray(value)), device=device)


def slot_object(variant, *, head_dim: int, dtype: str, arch: str, params: dict | None = None,
                window: int | None = None, rope: bool = False, name_prefix: str = "attngen",
                cache=None) -> tuple[Path, dict]:
    """Build (cached) the object file; returns it and role -> exported name: the ``slot_roles`` and "merge". The
    functions take a variant's tensor parameters as trailing arguments (a model binds them: bind_params.py)."""
    check_tvm_slot_hooks(variant)
    built = build_slot_library(variant, head_dim=head_dim, dtype=dtype, params=params, arch=arch, window=window,
                               rope=rope, cache=cache)
    merge = merge_symbol("merge_state_inplace", dtype)
    exports = tvm_slot_functions((head_dim,), (dtype,)) + [merge]
    objects = sorted(built.directory.glob("attention_*.o"))
    if variant.tensor_params:  # the model's binding of them, in the same object
        objects.append(bind_object(UNPREFIXED, cache))
        exports.append(UNPREFIXED)
    obj = build_slot_object(objects, exports, gencodes=arch_spec(arch).gencode.split(), prefix=name_prefix,
                            cache=cache)
    roles = slot_roles(lambda kind: f"{name_prefix}_{symbol(kind, dtype, head_dim)}")
    roles["merge"] = f"{name_prefix}_{merge}"
    if variant.tensor_params:
        roles["bind"] = bind_function_name(name_prefix)
    return obj, roles


def merge_function(dtype: str, arch: str):
    """attngen's CUDA merge (``merge_state_inplace``) for ``dtype``, built for ``arch``."""
    return load_library(support_library("merge_cuda", archs=(arch,)))[merge_symbol("merge_state_inplace", dtype)]


class CUDABackend:
    """The GPU's part of a cache: run time (on this machine's GPU), ahead of time (for a named arch), and the
    model library's export."""

    def check(self, shape: CacheShape, convention: str) -> None:
        check_cuda_shape(shape, convention)

    def runtime_parts(self, variant, shape: CacheShape, *, params, convention: str, cache):
        """(the cache's functions, built for this process, and the device the cache lives on)."""
        import torch
        import tvm

        from attngen.runtime.cuda import current_arch

        scalars, values = split_params(variant, params, shape)  # (checked before anything needs a GPU)
        if not torch.cuda.is_available():
            raise RuntimeError("target='cuda': this machine has no CUDA GPU (or torch has no CUDA); use target='cpu'")
        arch = current_arch()
        device = tvm.cuda(0)  # the GPU current_arch() describes
        tensors = [device_tensor(v, p.name, device) for p, v in zip(variant.tensor_params, values)]
        given = given_scalars(scalars, params)
        roles = cuda_slot_functions(variant, head_dim=shape.head_dim, dtype=shape.dtype,
                                    params=given, arch=arch, window=slot_window(shape), rope=shape.inline_rope,
                                    cache=cache)
        parts = CacheParts(attention=attention_entries(bind_tensor_params(roles, tensors), convention),
                           merge=merge_function(shape.dtype, arch),
                           helpers=helper_functions(shape, device_target("cuda", arch)))
        return parts, device

    def model_parts(self, bb, variant, shape: CacheShape, *, params, convention: str, arch: str | None,
                    name_prefix: str, cache):
        """(the cache's functions as ``ExternFunc``s of attngen's object and TVM's kernels added to ``bb``'s
        module, [the object as a static library for the IRModule's ``external_mods``])."""
        import tvm
        from tvm import relax as rx

        if not arch:
            raise ValueError("arch: a CUDA model library is built for a named GPU arch, e.g. arch='sm_90a'")
        check_tvm_slot_hooks(variant)
        scalars, values = split_params(variant, params, shape)  # (checked before anything is compiled)
        given = given_scalars(scalars, params)
        obj, names = slot_object(variant, head_dim=shape.head_dim, dtype=shape.dtype, arch=arch,
                                 params=given, window=slot_window(shape), rope=shape.inline_rope,
                                 name_prefix=name_prefix, cache=cache)
        externs = {role: tuple(map(rx.ExternFunc, n)) if isinstance(n, tuple) else rx.ExternFunc(n)
                   for role, n in names.items()}
        attention = attention_entries(externs, convention)
        if values:  # constants of the model, copied to the GPU at the first call and bound by the object's binding
            attention = emit_bound_slots(bb, attention, host_values(variant, values), name_prefix)
        exported = sorted({x for n in names.values() for x in (n if isinstance(n, tuple) else (n,))})
        parts = CacheParts(attention=attention, merge=externs["merge"],
                           helpers=add_helpers(bb, shape, device_target("cuda", arch), name_prefix))
        return parts, [tvm.runtime.load_static_library(str(obj), exported)]

    def export(self, mod, path: str | Path, arch: str | None) -> Path:
        if not arch:
            raise ValueError("arch: a CUDA model library is built for a named GPU arch, e.g. arch='sm_90a'")
        return export_cuda_model_library(mod, path, arch)

