"""Creating a TVM PagedKVCache with attngen's attention, at run time or inside a model library.

One core serves both devices and both times: a backend per device (:class:`CPUBackend`,
:class:`CUDABackend`) checks what it cannot serve and supplies the cache's functions
(:class:`CacheParts`), and :mod:`.create_call` turns a :class:`CacheShape` and those parts into
TVM's ``vm.builtin.paged_attention_kv_cache_create`` call, made in this process
(``create_paged_kv_cache``) or emitted into a Relax function (``emit_paged_kv_cache``,
``paged_kv_cache_module``) that ``export_model_library`` compiles: the Relax VM then creates the
cache from that library alone (no attngen, no Python callbacks).

A cache is used through TVM's ordinary builtins (``vm.builtin.kv_state_add_sequence``,
``kv_state_begin_forward``, ``attention_kv_cache_attention_with_fused_qkv``, ...). Token-tree
attention (speculative decoding) is served on both devices (its two slots filled); MLA layers are refused when the CacheShape is
made (``UnsupportedCacheFeature``).
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Protocol

from attngen.variants import builtin

from .cpu import CPUBackend
from .create_call import create_cache, emit_create
from .cuda import CUDABackend
from .shape import CacheShape


class Backend(Protocol):
    """A device's part of a cache (``CPUBackend``, ``CUDABackend``)."""

    def check(self, shape: CacheShape, convention: str) -> None:
        """Refuse what the device's slots cannot serve, before anything is built."""

    def runtime_parts(self, variant, shape: CacheShape, *, params, convention: str, cache) -> tuple:
        """(CacheParts of functions built for this process, the TVM device the cache lives on)."""

    def model_parts(self, bb, variant, shape: CacheShape, *, params, convention: str, arch, name_prefix: str,
                    cache) -> tuple:
        """(CacheParts of Relax expressions, the IRModule's external modules), the kernels added to ``bb``."""

    def export(self, mod, path: str | Path, arch: str | None) -> Path:
        """Compile a model IRModule holding the device's kernels into a shared library at ``path``."""


BACKENDS: dict[str, Backend] = {"cpu": CPUBackend(), "cuda": CUDABackend()}


def _backend(target: str):
    if target not in BACKENDS:
        raise ValueError(f"target {target!r}: attngen fills TVM PagedKVCache slots for target='cpu' or 'cuda'")
    return BACKENDS[target]


def create_paged_kv_cache(shape: CacheShape, variant=None, *, params: dict | None = None, target: str = "cpu",
                          convention: str = "tirx", cache=None):
    """A TVM PagedKVCache of ``shape`` whose attention slots run ``variant`` (default vanilla) and whose merge
    slot is attngen's merge; its data-moving kernels are TVM's own.

    params: values of the variant's extra parameters (defaults apply): scalars are compiled into the kernels,
    tensors bound to every call (on CUDA a torch tensor on the cache's GPU is shared, so that changing it in place
    changes the next calls; other values are copied once). target "cpu" or "cuda" (this machine's GPU);
    convention (CUDA): "tirx" (one function per slot, even split-KV in decode) or "flashinfer" (run + plan: TVM
    plans once per step on the host, the decode plan is attngen's load-balanced work list).
    cache: the BuildCache of the kernels' builds.
    """
    backend = _backend(target)
    backend.check(shape, convention)
    variant = variant if variant is not None else builtin("vanilla")
    parts, device = backend.runtime_parts(variant, shape, params=params, convention=convention, cache=cache)
    return create_cache(shape, parts, device)


class EmittedCache(NamedTuple):
    cache: object  # the Relax var holding the cache
    external_mods: list  # static libraries the IRModule's "external_mods" must hold (attngen's CUDA object)


def emit_paged_kv_cache(bb, shape: CacheShape, variant=None, *, params: dict | None = None, target: str = "cpu",
                        arch: str | None = None, convention: str = "tirx", name_prefix: str = "attngen",
                        cache=None) -> EmittedCache:
    """Emit the cache's create call into ``bb``'s current function, every kernel added to the model.

    Arguments as ``create_paged_kv_cache``. On the CPU the kernels become PrimFuncs of the model (the variant's
    hooks inlined, scalar parameters compiled in from ``params`` or their defaults). On CUDA attngen's functions
    are built for ``arch`` (e.g. "sm_90a") into one object file whose only global functions are
    ``__tvm_ffi_<name_prefix>_*`` (one prefix per cache of a model), which the create call names as
    ``ExternFunc``s; TVM's own kernels are PrimFuncs of the model. A variant's tensor parameters become
    constants of the model (their values from ``params``): each slot is wrapped in a binding function the model
    library exports, which appends them to TVM's arguments (``emit_bound_slots``; docs/tvm.md).
    """
    backend = _backend(target)
    backend.check(shape, convention)
    variant = variant if variant is not None else builtin("vanilla")
    parts, external_mods = backend.model_parts(bb, variant, shape, params=params, convention=convention, arch=arch,
                                               name_prefix=name_prefix, cache=cache)
    return EmittedCache(emit_create(bb, shape, parts), external_mods)


def paged_kv_cache_module(shape: CacheShape, variant=None, **kwargs):
    """An IRModule whose Relax function ``create_kv_cache()`` returns the cache, with attngen's object (CUDA) in
    its ``external_mods`` (arguments as ``emit_paged_kv_cache``)."""
    from tvm import relax as rx

    bb = rx.BlockBuilder()
    with bb.function("create_kv_cache", []):
        emitted = emit_paged_kv_cache(bb, shape, variant, **kwargs)
        bb.emit_func_output(emitted.cache)
    mod = bb.get()
    if emitted.external_mods:
        mods = list(mod.attrs["external_mods"]) if mod.attrs and "external_mods" in mod.attrs else []
        mod = mod.with_attr("external_mods", mods + emitted.external_mods)
    return mod


def export_model_library(mod, path: str | Path, *, target: str = "cpu", arch: str | None = None) -> Path:
    """Compile a model IRModule holding attngen's kernels and export it as a shared library: for the CPU, or for
    the CUDA ``arch`` (no GPU needed: nvcc builds every kernel)."""
    return _backend(target).export(mod, path, arch)
