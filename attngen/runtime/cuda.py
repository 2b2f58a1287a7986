"""PyTorch API over a CUDA library: decode and prefill / append with a plan/run split.

``plan_decode`` runs once per batch step on the host: it checks the page table
(indices inside the cache, lengths in range) on host copies, chooses how many KV
chunks each CTA column splits into (an even split that fills the GPU; the
load-balanced planner replaces it later) and allocates the partial-state
workspace. ``decode`` runs per layer: it checks shapes, dtypes and devices only,
never synchronises, and launches on the current CUDA stream.

An fp8 cache (torch ``float8_e4m3fn`` / ``float8_e5m2``, see ``fp8.py``: paged pages, or ragged k / v for
prefill) is read by the decode and prefill functions built for that K/V dtype (``BuildConfig.kv_dtypes``), whose
calls take ``k_scale`` and ``v_scale`` as on the CPU backend. Decode and prefill plans are the 16-bit cache's: both
prefill templates read fp8 caches (the Hopper one on sm_90a, the mma.sync one everywhere), widening them exactly.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from attngen.build import build as build_library
from attngen.ir.mask_class import mask_needs_map
from attngen.schedules.build_config import DTYPE_SHORT, BuildConfig, symbol
from attngen.schedules.dtypes import DTYPE_BYTES, is_fp8
from attngen.schedules.ffi_enums import DecodeBackend, PrefillTemplate, PrefillTileRows
from attngen.schedules.template_decode_tc import MAX_GROUP

from .checks import (FP8_BITS_HINT, AttentionArgumentError, as_numpy, check_indptr, check_paged, check_qkv_heads,
                     check_ragged, check_tensor, dtype_name, paged_lengths)
from . import hook_pass as hook_pass_module
from .cuda_plans import MAX_GRID_BATCH, DecodeLaunch, DecodePlan, PrefillPlan
from .deferred_parts import link_deferred_parts
from .fp8 import device_kv_scales, scale_args
from .kv_pool import heads_adjacent
from .mma_split import may_split
from .module import BuiltModule, resolve_sm_scale, scale_kwargs
from .params import check_query_positions, resolve_params
from .replay_guard import poison_rows_over_bound
from .tile_map import KVBound, TileMap, build_tile_map, params_key
from .views import PagedKV, RaggedKV, host_kv_lengths
from .work_order import device_sms


def is_cuda(t) -> bool:
    return hasattr(t, "detach") and t.device.type == "cuda"


def _check_on_device(named, device) -> None:
    """Every (name, tensor) of ``named`` a CUDA tensor on ``device`` (q's): one call runs on one GPU."""
    for name, t in named:
        if not is_cuda(t):
            raise AttentionArgumentError(f"{name}: must be a CUDA tensor")
        if t.device != device:
            raise AttentionArgumentError(f"{name}: on {t.device}, q on {device}: one call runs on one GPU "
                                         "(move it with .to(q.device))")


def _tensor_extras(variant, extras) -> list:
    """(params['name'], tensor) of the resolved parameters that are tensors."""
    return [(f"params['{p.name}']", v) for p, v in zip(variant.params, extras) if hasattr(v, "shape")]


def current_arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major == 9 else "")


def _hopper_device(device) -> bool | None:
    """Whether ``device`` is a GPU of compute capability 9.0, where a library built for sm_90a runs the Hopper
    template (elsewhere a multi-arch library runs mma.sync); None for a host device: a plan made from host index
    arrays (as FlashInfer's plans take them) may run on any GPU."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) == (9, 0)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability(index)


def _kv_device(kv):
    """The device a paged or ragged view's keys lie on."""
    return (kv.pages if isinstance(kv, PagedKV) else kv.k).device


PREFILL_TEMPLATES = {None: PrefillTemplate.AUTO, "mma_sync": PrefillTemplate.MMA_SYNC,
                     "hopper": PrefillTemplate.HOPPER}


def _prefill_template(template: str | None, archs) -> PrefillTemplate:
    """The template a plan runs (16-bit and fp8 caches alike)."""
    if template not in PREFILL_TEMPLATES:
        raise AttentionArgumentError(f"template: {template!r} is not a prefill template; use None (the library's "
                                     "choice), 'mma_sync' or 'hopper'")
    if template == "hopper" and "sm_90a" not in archs:
        raise AttentionArgumentError(f"template: 'hopper' needs a library built for sm_90a (this one: {list(archs)}); "
                                     "build with archs including sm_90a, or plan with template=None")
    return PREFILL_TEMPLATES[template]


def _tensor_key(t) -> tuple:
    return (id(t), getattr(t, "_version", None))


def _check_aligned(name: str, t) -> None:
    if hasattr(t, "data_ptr") and t.data_ptr() % 16:
        raise AttentionArgumentError(f"{name}: data must be 16-byte aligned (the kernels use 16-byte vector "
                                     "accesses); pass a tensor that starts on an aligned address")


def choose_num_chunks(batch: int, num_kv_heads: int, max_kv_len: int, num_sms: int,
                      min_chunk: int = 256, total_kv_len: int | None = None) -> int:
    """Even split (every request into the same number of chunks): enough CTAs to fill the GPU about twice,
    never chunks shorter than ``min_chunk``, and no chunk of the longest request longer than the batch's
    mean work per CTA slot, so that a skewed batch (one long request among short ones) spreads its long
    request over the GPU instead of running it on one CTA per head after the rest have finished.
    ``total_kv_len``: the batch's sum of KV lengths (default: a uniform batch, batch x max_kv_len)."""
    if max_kv_len <= min_chunk:
        return 1
    total = batch * max_kv_len if total_kv_len is None else total_kv_len
    slots = 2 * num_sms  # CTAs in flight, about two per SM
    per_slot = max(min_chunk, math.ceil(total * max(num_kv_heads, 1) / slots))
    return max(1, min(math.ceil(max_kv_len / per_slot), math.ceil(max_kv_len / min_chunk)))


def _check_kv_view(kv, *views) -> None:
    """Refuse a ``kv`` of another type (a tensor, a tuple) by name, before any of its fields is read."""
    if not isinstance(kv, views):
        names = " or ".join(v.__name__ for v in views)
        raise AttentionArgumentError(f"kv: expected {names}, got {type(kv).__name__}")


class CUDAAttention(BuiltModule):
    """Attention of one variant on a CUDA GPU, from a library built by ``attngen.build``."""

    @classmethod
    def build(cls, variant, head_dims=(128,), dtypes=("float16",), archs=None, layouts=("NHD", "HND"),
              max_group_size: int = 8, kernels=("decode", "prefill"), hook_math: str = "approx", kv_dtypes=(),
              link: str = "whole", **kwargs):
        """Build (or take from the cache) the variant's CUDA library for this GPU's arch unless ``archs`` is
        given; ``hook_math``: "approx" (hardware approximations in the hooks) or "precise" (BuildConfig).
        ``kv_dtypes``: the K/V dtype of each query dtype (() = the query's; an fp8 format for an fp8 cache,
        read by the decode and prefill kernels; not with kernels=("tvm",)). ``link``: "whole" (templates and
        hooks compiled as one program) or "lto" (the hooks linked into template objects cached per hook
        signature: an edited hook rebuilds in seconds; BuildConfig.link)."""
        cfg = BuildConfig("cuda", head_dims, dtypes, archs or (current_arch(),), layouts, kernels=kernels,
                          max_group_size=max_group_size, hook_math=hook_math, kv_dtypes=kv_dtypes, link=link)
        res = build_library(variant, cfg, **kwargs)
        return cls(variant, res.library, res.manifest)

    def _decode_workspace(self, num_qo_heads: int, num_kv_heads: int, head_dim: int, batch: int, items: int,
                          device, counters: bool = True, kv_bytes: int = 2, pair: int = 1):
        """The load-balanced decode workspace of this shape, grown when a batch (or a fixed-chunk plan's
        work items) exceeds its bounds, unless a graph-safe plan was made in it (a CUDA graph captured with that
        plan reads this workspace's buffers: then the bound is an error naming it); ``counters``: with the fused
        merge's arrival counters; ``kv_bytes``: bytes per cache element (1: fp8, whose tiles leave a different
        number of CTAs per SM)."""
        import torch

        from .decode_plan import DecodeBounds, DecodeWorkspace, decode_tc_ctas_per_sm

        key = (str(device), num_qo_heads, num_kv_heads, head_dim, counters, kv_bytes, pair)
        spaces = self.__dict__.setdefault("_decode_spaces", {})
        ws = spaces.get(key)
        if ws is not None and ws.graph_safe and (batch > ws.bounds.max_batch or items > ws.bounds.max_work_items):
            bound, need, have = (("max_batch", batch, ws.bounds.max_batch) if batch > ws.bounds.max_batch else
                                 ("max_work_items", items, ws.bounds.max_work_items))
            raise AttentionArgumentError(
                f"{bound}: this plan needs {need}, the decode workspace holds {have}; a graph-safe plan was made in "
                f"it, and a CUDA graph captured with that plan reads this workspace, which a larger one would not "
                f"replace: declare the bound with the first plan of this shape (plan_decode(..., {bound}={need}))")
        if ws is None or batch > ws.bounds.max_batch or items > ws.bounds.max_work_items:
            props = torch.cuda.get_device_properties(device)
            per_sm = decode_tc_ctas_per_sm(head_dim, props.shared_memory_per_multiprocessor,
                                           props.shared_memory_per_block_optin, kv_bytes)
            ctas = max(1, per_sm * props.multi_processor_count // num_kv_heads)
            # a power of two, within the merge kernel's grid limit
            max_batch = min(MAX_GRID_BATCH, max(64, 1 << max(batch - 1, 0).bit_length()))
            grown = max(items, 2 * ws.bounds.max_work_items if ws is not None else 0)
            ws = spaces[key] = DecodeWorkspace(DecodeBounds(max_batch, ctas, grown if items else 0), num_qo_heads,
                                               head_dim, device, num_kv_heads=num_kv_heads if counters else 0,
                                               resident_slots=per_sm * props.multi_processor_count)
        return ws

    def _cache_functions(self, kind: str, kv_dtype: str, head_dim: int) -> list[str]:
        """The functions of ``kind`` that read a ``kv_dtype`` cache at ``head_dim``: the 16-bit cache's one (built
        or not), or for an fp8 cache the built ones, one per query dtype the library pairs with it."""
        if not is_fp8(kv_dtype):
            return [symbol(kind, kv_dtype, head_dim)]
        return [name for q in self.manifest["config"]["dtypes"] if (name := symbol(kind, q, head_dim, kv_dtype))
                in self.functions]

    def has_decode(self, kv: PagedKV, head_dim: int) -> bool:
        """Whether the library holds the decode kernel for this cache's layout and dtype at ``head_dim``."""
        kind = f"batch_decode_paged_{kv.layout.lower()}"
        return any(name in self.functions for name in self._cache_functions(kind, kv.kv_dtype, head_dim))

    def _require_fp8_functions(self, kind: str, kv, head_dim: int, what: str) -> None:
        """Refuse an fp8 cache that no function of ``kind`` reads at ``head_dim``, naming the rebuild."""
        if not self._cache_functions(kind, kv.kv_dtype, head_dim):
            layout = f" {kv.layout}" if isinstance(kv, PagedKV) else " ragged"
            raise AttentionArgumentError(
                f"{self.library.name} has no {what} function over a{layout} {kv.kv_dtype} cache at head_dim "
                f"{head_dim}: it was built for {sorted(self.functions)}; rebuild with kv_dtypes including "
                f"{kv.kv_dtype}, kernels including {what}, head_dims including {head_dim} and the needed layout")

    def prepared_scales(self, q, kv, k_scale, v_scale) -> dict:
        given = scale_kwargs(k_scale, v_scale)  # (a 16-bit cache refuses scales in _scale_args)
        return dict(zip(given, self._scale_args(q, kv, k_scale, v_scale))) if given else {}

    @staticmethod
    def _scale_args(q, kv: PagedKV | RaggedKV, k_scale, v_scale) -> tuple:
        """The fp8 functions' (k_scale, v_scale: float32 [Hkv] or [1]) on q's device; () for a 16-bit cache."""
        return scale_args(kv.kv_dtype, k_scale, v_scale, lambda scale, name: device_kv_scales(
            scale, name, kv_dtype=kv.kv_dtype, num_kv_heads=kv.num_kv_heads, like=q))

    def plan_decode(self, kv: PagedKV, num_qo_heads: int, head_dim: int, *, num_chunks: int | None = None,
                    tensor_cores: bool | None = None, fixed_chunk: int = 0, graph_safe: bool = False,
                    fused_merge: bool | None = None, kv_heads_per_cta: int | None = None, max_batch: int = 0,
                    max_work_items: int = 0):
        """Plan one decode step (reused by every layer). Without ``num_chunks`` the split is load-balanced
        (the host planner's work list, tensor-core template); a plan is valid until the next load-balanced
        ``plan_decode`` of the same shape. ``num_chunks`` forces an even split of every request into that
        many chunks. ``tensor_cores``: None lets the library choose (for a uniform batch it may take the even
        split's grid launch where that serves at least as well: ``decode_plan.grid_chunks_for_uniform_batch``),
        True / False force the tensor-core template (load-balanced unless ``num_chunks`` is given) or the
        CUDA-core template (which splits evenly). ``fixed_chunk`` > 0: chunk boundaries
        independent of the rest of the batch (batch-invariant results). ``graph_safe``: launch grids that depend
        only on the workspace's bounds, so a CUDA graph captured with this plan replays any later plan of
        the same shape (same q / page-table buffers, batch size and bounds). ``fused_merge`` (load-balanced
        plans): True, the decode kernel merges split requests itself, the CTA that writes a request's last
        partial state merging them; False, the separate merge kernel runs after it; None (default): as
        ``decode_plan.choose_fused_merge`` decides (fused for graph-safe plans and where some request writes
        its output directly, the merge kernel for an all-split batch). ``kv_heads_per_cta`` (tensor-core
        template): 2, each CTA serves two KV heads, whose rows of a token an NHD cache stores side by side, so
        rows of 128 bytes or less are read in runs of twice that; 1, one head per CTA; None (default): as
        ``decode_plan.kv_heads_per_cta`` decides (pairs on NHD caches wherever a pair can serve the call).
        ``max_batch`` / ``max_work_items`` (load-balanced plans): the least bounds of the shape's workspace, which
        otherwise grows to a batch (or a fixed-chunk plan's work items) above its bounds, except once a graph-safe
        plan was made in it: declare there, with the first plan, the largest batch (and fixed-chunk work items)
        its graphs will replay."""
        import torch

        _check_kv_view(kv, PagedKV)
        dtype = dtype_name(kv.pages)
        check_tensor(kv.pages, "kv.pages", 5, strided="any")  # (its layout: check_paged below)
        if dtype not in DTYPE_SHORT:
            raise AttentionArgumentError(f"kv.pages: dtype {dtype} is no K/V dtype of the decode functions "
                                         f"({', '.join(DTYPE_SHORT)}){FP8_BITS_HINT if dtype == 'uint8' else ''}")
        if is_fp8(dtype):  # built for this case? (the query dtype is the call's)
            self._require_fp8_functions(f"batch_decode_paged_{kv.layout.lower()}", kv, head_dim, "decode")
        else:
            self.function(f"batch_decode_paged_{kv.layout.lower()}", dtype, head_dim)
        batch = check_paged(kv, head_dim, dtype, None)
        if batch > MAX_GRID_BATCH:
            raise AttentionArgumentError(f"kv.indptr: {batch} requests; one launch serves at most {MAX_GRID_BATCH}")
        if num_qo_heads % kv.num_kv_heads:
            raise AttentionArgumentError(f"num_qo_heads={num_qo_heads} is not a multiple of the cache's "
                                         f"{kv.num_kv_heads} KV heads")
        indptr = as_numpy(kv.indptr, "kv.indptr")
        last = as_numpy(kv.last_page_len, "kv.last_page_len")
        lens = paged_lengths(np.diff(indptr), last, kv.page_size)
        check_query_positions(self.variant, np.ones(batch, np.int64), lambda: lens, decode=True)
        longest = int(lens.max(initial=0))
        from .decode_plan import decode_tc_fits, grid_chunks_for_uniform_batch, items_needed
        from .decode_plan import kv_heads_per_cta as kv_heads_per_cta_for

        if fixed_chunk < 0:
            raise AttentionArgumentError(f"fixed_chunk: must be 0 (off) or a positive key count, got {fixed_chunk}")
        kv_bytes = DTYPE_BYTES[dtype]
        def tc_fits() -> bool:  # whether a tensor-core tile fits the device's shared memory
            return decode_tc_fits(
                head_dim, torch.cuda.get_device_properties(kv.pages.device).shared_memory_per_block_optin, kv_bytes)

        def on_tensor_cores() -> bool:  # whether the call surely runs on the tensor-core template
            return (tensor_cores is True or (tensor_cores is None and num_chunks is None)) and tc_fits()

        balanced = num_chunks is None and tensor_cores is not False and tc_fits()
        group = num_qo_heads // kv.num_kv_heads
        pair = kv_heads_per_cta_for(kv_heads_per_cta, head_dim=head_dim, kv_bytes=kv_bytes, layout=kv.layout,
                                    num_kv_heads=kv.num_kv_heads, group=group, tensor_cores=on_tensor_cores,
                                    kv_lens=lens, adjacent_heads=heads_adjacent(kv.pages, kv.layout))
        # grid rows, each planned as one head: KV heads, or pairs of them, or parts of a group above the tensor-core
        # tile's rows (csrc/decode_tc_tile.cuh decode_tc_group_parts), of at most MAX_GROUP query heads each
        parts = -(-group // MAX_GROUP) if tensor_cores is not False else 1
        slots = kv.num_kv_heads * parts // pair
        plan_group = group * pair if parts == 1 else MAX_GROUP
        if not balanced and (graph_safe or fixed_chunk):
            raise AttentionArgumentError(
                "graph_safe / fixed_chunk: need the load-balanced plan (tensor-core template, no num_chunks, a "
                "tensor-core tile that fits this GPU); drop num_chunks / tensor_cores=False")
        if balanced:
            if max_batch < 0 or max_work_items < 0:
                raise AttentionArgumentError(f"max_batch / max_work_items: must be 0 (none) or positive, got "
                                             f"{max_batch} / {max_work_items}")
            items = items_needed(lens, fixed_chunk)
            ws = self._decode_workspace(num_qo_heads, slots, head_dim, max(batch, max_batch),
                                        max(items, max_work_items) if items or max_work_items else 0,
                                        kv.pages.device, fused_merge is not False, kv_bytes, pair)
            split = ws.split(lens.astype(np.int32), plan_group, fixed_chunk=fixed_chunk)
            automatic = tensor_cores is None and not graph_safe and not fixed_chunk and fused_merge is None
            grid = grid_chunks_for_uniform_batch(lens, split, slots, ws.resident_slots) if automatic else 0
            if grid:  # a uniform batch the even-split grid launch serves at least as well
                num_chunks, tensor_cores = grid, True
            else:
                n_merge, fused = ws.fill(split, fused_merge=fused_merge, graph_safe=graph_safe)
                ws.generation += 1
                ws.graph_safe = ws.graph_safe or graph_safe
                merges = 0 if fused else (ws.bounds.max_merges if graph_safe else n_merge)
                launch = DecodeLaunch(ws.part_o, ws.part_lse, 1, DecodeBackend.TENSOR_CORES, ws.device_plan,
                                      ws.bounds.num_ctas, merges, pair)
                return DecodePlan(batch, num_qo_heads, kv.num_kv_heads, head_dim, launch, ws, ws.generation, split,
                                  fused, longest)
        if num_chunks is None:
            sms = torch.cuda.get_device_properties(kv.pages.device).multi_processor_count
            num_chunks = choose_num_chunks(batch, slots, longest, sms, total_kv_len=int(lens.sum()))
        if num_chunks < 1:
            raise AttentionArgumentError(f"num_chunks: must be at least 1, got {num_chunks}")
        dev = kv.pages.device
        part_o = torch.empty((batch, num_chunks, num_qo_heads, head_dim) if num_chunks > 1 else (1, 1, 1, head_dim),
                             dtype=torch.float32, device=dev)
        part_lse = torch.empty((batch, num_chunks, num_qo_heads) if num_chunks > 1 else (1, 1, 1),
                               dtype=torch.float32, device=dev)
        backend = {None: DecodeBackend.AUTO, True: DecodeBackend.TENSOR_CORES,
                   False: DecodeBackend.CUDA_CORES}[tensor_cores]
        if tensor_cores is False:  # a link-time build may link the CUDA-core kernels on first use
            link_deferred_parts(self, dev, "decode")
        return DecodePlan(batch, num_qo_heads, kv.num_kv_heads, head_dim,
                          DecodeLaunch(part_o, part_lse, num_chunks, backend, kv_heads_per_cta=pair),
                          max_kv_len=longest)

    def decode(self, q, kv: PagedKV, *, plan: DecodePlan | None = None, sm_scale: float | None = None,
               params: dict | None = None, out=None, lse=None, k_scale=None, v_scale=None):
        """q: [B, Hq, D] on the GPU, one query per request. Returns (out [B, Hq, D], lse [B, Hq]).
        ``k_scale``, ``v_scale``: an fp8 cache's scales (a float, or a float32 CUDA tensor of 1 or Hkv entries;
        ``device_kv_scales``)."""
        check_tensor(q, "q", 3, strided="tokens")
        _check_kv_view(kv, PagedKV)
        dt, d, batch = dtype_name(q), int(q.shape[2]), int(q.shape[0])
        if plan is None:
            plan = self.plan_decode(kv, int(q.shape[1]), d)
        if (plan.batch_size, plan.num_qo_heads, plan.head_dim) != (batch, int(q.shape[1]), d):
            raise AttentionArgumentError(
                f"plan: made for batch {plan.batch_size}, {plan.num_qo_heads} heads, head_dim {plan.head_dim}; "
                f"q is {tuple(q.shape)}: plan again for this batch")
        if plan.num_kv_heads != kv.num_kv_heads:
            raise AttentionArgumentError(f"plan: made for {plan.num_kv_heads} KV heads; kv has {kv.num_kv_heads}: "
                                         f"plan again for this cache")
        check_tensor(kv.pages, "kv.pages", 5, kv.kv_dtype if is_fp8(kv.kv_dtype) else dt, strided="pages")
        check_qkv_heads(q, kv.num_kv_heads, d)
        # a 16-bit cache is in q's dtype (checked above): its function is the query dtype's
        fn = self.function(f"batch_decode_paged_{kv.layout.lower()}", dt, d, kv.kv_dtype)
        max_group = self.manifest["config"]["max_group_size"]
        if int(q.shape[1]) // kv.num_kv_heads > max_group and plan.backend == DecodeBackend.CUDA_CORES:
            raise AttentionArgumentError(
                f"q: group size {int(q.shape[1]) // kv.num_kv_heads} (num_qo_heads / num_kv_heads) is above this "
                f"library's max_group_size={max_group}, which bounds the CUDA-core template; plan without "
                f"tensor_cores=False (the tensor-core template serves any group), or rebuild with a larger "
                f"max_group_size")
        _check_on_device((("q", q), ("kv.pages", kv.pages), ("kv.indices", kv.indices), ("kv.indptr", kv.indptr),
                          ("kv.last_page_len", kv.last_page_len)), q.device)
        out, lse = self.outputs(q, batch, out, lse)
        _check_on_device((("out", out), ("lse", lse)), q.device)
        for name, t in (("q", q), ("out", out), ("kv.pages", kv.pages)):
            _check_aligned(name, t)
        scales = self._scale_args(q, kv, k_scale, v_scale)
        extras = resolve_params(self.variant, params, num_qo_heads=int(q.shape[1]), batch_size=batch,
                                num_kv_heads=kv.num_kv_heads, head_dim=d, total_q=batch, positions=plan.max_kv_len)
        _check_on_device(_tensor_extras(self.variant, extras), q.device)
        scale = resolve_sm_scale(sm_scale, d)
        if plan.work is not None and plan.generation != plan.work.generation:
            raise AttentionArgumentError("plan: superseded by a later plan_decode of the same shape (they share "
                                         "one workspace); plan again for this batch")
        fn(q, kv.pages, kv.indices, kv.indptr, kv.last_page_len, out, lse, *scales, scale, *plan.launch.ffi_args(),
           *extras)
        return out, lse

    def plan_prefill(self, qo_indptr, kv: PagedKV | RaggedKV, head_dim: int, *,
                     wide_tiles: bool | None = None, template: str | None = None,
                     tile_map: bool | None = None, max_qo_len: int | None = None,
                     work_order: bool | None = None, hook_pass: bool | None = None,
                     tail_split: bool | None = None) -> PrefillPlan:
        """Host-side checks of the batch's index arrays (host copies) and the grid size. ``wide_tiles``:
        None (default) or True: 128 query rows per CTA (4 warps x two m-tiles) when the longest request has
        at least 256 rows (tokens x group) at head_dim <= 128, halving the K/V traffic per FLOP; 64 rows
        otherwise. False: always 64 rows (both apply to the mma.sync template). ``template``: None (default)
        lets the library choose (on devices of compute capability 9.0 with a library built for sm_90a, the
        Hopper template; else the mma.sync one); "mma_sync" or "hopper" forces one (A/B runs, tests).
        ``tile_map``: None (default) lets calls with a mask the static analysis cannot reduce to bounds
        derive the mask's tile structure on the device, which both templates walk (made on the first call
        with given mask parameters, kept in the plan for every later call with the same tensors; make it
        before capturing a CUDA graph); True requires it (refused where it cannot serve); False never.
        ``max_qo_len``: a bound on every request's query rows that sizes the launch instead of this batch's
        longest request (at least that, at most the batch's total rows). A CUDA graph captured with such a
        plan replays any later batch of the same size and total rows whose requests stay within the bound:
        write its qo_indptr and page table into the captured tensors (page tables may keep spare entries)
        and replay (``plan.check_replay(qo_indptr)`` checks a batch on the host before it is written). Where the
        bound is below the total rows, each call also sets every row (out and lse) of a request longer than the
        bound to NaN, by a few capturable device operations (runtime/replay_guard.py): a replay past the bound,
        which no CTA of the captured grid would fully cover, is loud instead of silently wrong. Graph replays over
        changing batches need ``tile_map=False`` (a map is one batch's).
        ``work_order``: None (default) or True: the Hopper template deals the batch's work longest first
        over all requests (runtime/work_order.py; made on the first call outside a CUDA graph capture: a
        graph captured by a plan's first call runs request by request; later batches replayed within the
        bounds keep the first batch's order, which changes no result); False: request by request. It has
        no effect on the mma.sync template. ``hook_pass``: None (default) applies a variant's key and query
        transforms once per row ahead of the prefill (csrc/hook_pass.cuh, into a workspace of about the size of
        the call's keys and queries) where the variant has a key transform and a request spans 64 or more
        packed query rows (tokens x GQA group); else the kernels apply them on every tile. True always, False
        never (the results agree to rounding). Over an fp8 cache the kernels apply them (they see dequantised
        rows). ``tail_split``: None (default) lets the Hopper template cut the key tiles of a launch's last,
        part-filled round of work into stretches that even out its CTAs, merged in the kernel
        (runtime/work_tail.py; variants without a mask or logits hook over 16-bit caches, where it shortens the
        launch by 1% or more), and every item's key tiles where a launch has fewer items than SMs (appends: verify
        steps, short chunks; causal variants too, whose mask is its constant bounds); on the mma.sync template it
        cuts every item's keys into chunks where a launch of 64-row tiles has no more CTAs than SMs
        (runtime/mma_split.py); False never. On the Hopper template it rides on the work order
        (``work_order=False`` turns it off too). Either split's slots and counters are the plan's: a plan serves
        one call at a time (calls on two streams at once take a plan each). An fp8 cache is planned as a 16-bit
        one (both templates read it)."""
        _check_kv_view(kv, PagedKV, RaggedKV)
        dtype = dtype_name(kv.pages if isinstance(kv, PagedKV) else kv.k)
        kernel = _prefill_template(template, self.manifest["config"]["archs"])
        kind = f"batch_prefill_paged_{kv.layout.lower()}" if isinstance(kv, PagedKV) else "batch_prefill_ragged"
        if is_fp8(dtype):  # built for this case? (the query dtype is the call's)
            self._require_fp8_functions(kind, kv, head_dim, "prefill")
        else:
            self.function(kind, dtype, head_dim)
        qo = check_indptr(qo_indptr, "qo_indptr", None, queries=True)
        batch = len(qo) - 1
        if isinstance(kv, PagedKV):
            check_paged(kv, head_dim, dtype, batch)
        else:
            check_ragged(kv, head_dim, dtype, batch)
        check_query_positions(self.variant, np.diff(qo), lambda: host_kv_lengths(kv))
        if batch > MAX_GRID_BATCH:
            raise AttentionArgumentError(f"qo_indptr: {batch} requests; one launch serves at most {MAX_GRID_BATCH}")
        if work_order not in (None, True, False):
            raise AttentionArgumentError(f"work_order: expected None, True or False, got {work_order!r}")
        if tail_split not in (None, False):
            raise AttentionArgumentError(f"tail_split: expected None or False, got {tail_split!r}")
        hook_pass_module.check_choice(self.variant, hook_pass)
        if kernel == PrefillTemplate.MMA_SYNC:  # a link-time build may link the mma.sync kernels on first use
            link_deferred_parts(self, _kv_device(kv), "prefill")
        on_hopper = _hopper_device(getattr(qo_indptr, "device", "cpu"))  # (None: a host qo_indptr, either)
        hopper_kernels = "sm_90a" in self.manifest["config"]["archs"]
        ordered = work_order is not False and hopper_kernels and kernel != PrefillTemplate.MMA_SYNC \
            and on_hopper is not False
        kv_lens = host_kv_lengths(kv) if ordered or self.manifest.get("float_position_limit") else None
        self._check_float_positions(kv_lens)
        if tile_map not in (None, True, False):
            raise AttentionArgumentError(f"tile_map: expected None, True or False, got {tile_map!r}")
        why = self._tile_map_problem(dtype, head_dim) if tile_map is not False else "not asked for"
        if tile_map is True and why:
            raise AttentionArgumentError(f"tile_map: {why}; plan with tile_map=None or False")
        if why is None and kv_lens is None:
            kv_lens = host_kv_lengths(kv)  # (the map's width: known here, no device read when it is made)
        longest = int(np.diff(qo).max(initial=0))
        if max_qo_len is not None:
            if isinstance(max_qo_len, bool) or not isinstance(max_qo_len, (int, np.integer)) \
                    or not longest <= max_qo_len <= max(int(qo[-1]), longest):
                raise AttentionArgumentError(
                    f"max_qo_len: {max_qo_len!r} must be an integer from this batch's longest request ({longest}) "
                    f"to its total query rows ({int(qo[-1])})")
            longest = int(max_qo_len)
        # calls that may run the mma.sync template (forced, no Hopper kernels, or another GPU) without a tile map:
        # their keys may be split where the launch has few CTAs (runtime/mma_split.py); the keys' lengths are read
        # (a device-to-host copy) only for a batch that could split
        mma_split = tail_split is not False and why is not None and (
            kernel == PrefillTemplate.MMA_SYNC or not hopper_kernels or on_hopper is not True) \
            and may_split(longest, batch, kv.num_kv_heads, device_sms(_kv_device(kv)) or 0, head_dim=head_dim,
                          rows_64=wide_tiles is False)
        if mma_split and kv_lens is None:
            kv_lens = host_kv_lengths(kv)
        return PrefillPlan(batch, int(qo[-1]), longest, _tensor_key(qo_indptr),
                           {None: PrefillTileRows.AUTO, True: PrefillTileRows.ROWS_128,
                            False: PrefillTileRows.ROWS_64}[wide_tiles], kernel, why is None,
                           lengths=(np.diff(qo), kv_lens) if ordered else None, hook_pass=hook_pass,
                           tail_split=tail_split, masked_split=self.manifest["config"].get("link") != "lto",
                           kv_bound=KVBound.of(kv, int(kv_lens.max(initial=0))) if why is None else None,
                           replay_bound=max_qo_len is not None,
                           mma_kv_lens=kv_lens if mma_split else None)

    def _check_float_positions(self, kv_lens) -> None:
        """This build's prefill passes key positions to the logits hook as floats (exact below the limit
        recorded in the manifest, codegen/logits_split.py): refuse a batch with a longer request
        (kv_lens: [B] keys per request, host)."""
        limit = self.manifest.get("float_position_limit")
        if not limit:
            return
        longest = int(kv_lens.max(initial=0))
        if longest >= limit:
            raise AttentionArgumentError(
                f"kv: a request of {longest} keys; this library's logits hook takes key positions as float32, "
                f"exact below {limit}: build it with hook_math='precise' for longer requests")

    def _tile_map_problem(self, dtype: str, head_dim: int) -> str | None:
        """Why calls of this library over a ``dtype`` cache cannot walk a mask-derived tile map; None when they
        can."""
        if not mask_needs_map(self.variant):
            return f"variant '{self.variant.name}' has no mask beyond its bounds: there is nothing to map"
        if not any(name in self.functions for name in self._cache_functions("prefill_tile_map", dtype, head_dim)):
            return ("this library has no tile-map classifier (a linked build by an attngen older than 2026-12-03): "
                    "rebuild it")
        return None

    def _tile_map(self, plan: PrefillPlan, q, kv, qo_indptr, dtype: str, head_dim: int, params: dict | None,
                  extras: tuple, kv_dtype: str | None = None) -> TileMap | None:
        """The plan's map for these mask parameters (derived on first use), or None where none serves."""
        if not plan.tile_map:
            return None
        key = params_key(self.variant, params)
        if key not in plan.maps or not plan.maps[key].made_from(params):
            from attngen.schedules.template_prefill_hopper import HopperConfig

            tile = HopperConfig(head_dim)  # the maps' tiling (csrc/tile_map.cuh MapTile) is the Hopper tile
            plan.maps.clear()  # one map at a time: a plan serves one batch's parameters
            plan.maps[key] = build_tile_map(
                self.function("prefill_tile_map", dtype, head_dim, kv_dtype), self.variant, qo_indptr, kv,
                max_qo_len=plan.max_qo_len, group=int(q.shape[1]) // kv.num_kv_heads,
                num_kv_heads=kv.num_kv_heads, rows=tile.rows, keys=tile.keys, extras=extras, params=params,
                max_kv_len=plan.max_kv_len(kv), device_lists=True)
        return plan.maps[key]

    def prefill(self, q, kv: PagedKV | RaggedKV, qo_indptr, *, plan: PrefillPlan | None = None,
                sm_scale: float | None = None, params: dict | None = None, out=None, lse=None, k_scale=None,
                v_scale=None):
        """Prefill / append: q [total_q, Hq, D] ragged by qo_indptr [B+1]; query row i of a request sits at
        position kv_len - qo_len + i. Returns (out [total_q, Hq, D], lse [total_q, Hq]). ``k_scale``,
        ``v_scale``: an fp8 cache's scales (a float, or a float32 CUDA tensor of 1 or Hkv entries;
        ``device_kv_scales``)."""
        check_tensor(q, "q", 3, strided="tokens")
        _check_kv_view(kv, PagedKV, RaggedKV)
        dt, d = dtype_name(q), int(q.shape[2])
        fp8 = kv.kv_dtype if is_fp8(kv.kv_dtype) else None  # the function's K/V dtype: None for the query's
        if plan is None:
            plan = self.plan_prefill(qo_indptr, kv, d)
        if plan.total_q != int(q.shape[0]):
            raise AttentionArgumentError(f"plan: made for {plan.total_q} query rows, q has {q.shape[0]}: plan again")
        if plan.qo_indptr_key != _tensor_key(qo_indptr):
            raise AttentionArgumentError("plan: made from another qo_indptr (or one changed since): plan again with "
                                         "this batch's qo_indptr")
        check_qkv_heads(q, kv.num_kv_heads, d)
        if isinstance(kv, PagedKV):
            check_tensor(kv.pages, "kv.pages", 5, strided="pages")  # (a call may pass another pool than its plan's)
            fn = self.function(f"batch_prefill_paged_{kv.layout.lower()}", dt, d, fp8)
            kv_args = (kv.pages, kv.indices, kv.indptr, kv.last_page_len)
            data = [("kv.pages", kv.pages)]
            index = [("kv.indices", kv.indices), ("kv.indptr", kv.indptr), ("kv.last_page_len", kv.last_page_len)]
        else:
            fn = self.function("batch_prefill_ragged", dt, d, fp8)
            kv_args = (kv.k, kv.v, kv.indptr)
            data = [("kv.k", kv.k), ("kv.v", kv.v)]
            index = [("kv.indptr", kv.indptr)]
        _check_on_device([("q", q), ("qo_indptr", qo_indptr)] + data + index, q.device)
        out, lse = self.outputs(q, int(q.shape[0]), out, lse)
        _check_on_device((("out", out), ("lse", lse)), q.device)
        for name, t in [("q", q), ("out", out)] + data:
            _check_aligned(name, t)
        scales = self._scale_args(q, kv, k_scale, v_scale)
        extras = resolve_params(self.variant, params, num_qo_heads=int(q.shape[1]), batch_size=plan.batch_size,
                                num_kv_heads=kv.num_kv_heads, head_dim=d, total_q=int(q.shape[0]),
                                positions=lambda: plan.max_kv_len(kv))
        _check_on_device(_tensor_extras(self.variant, extras), q.device)
        scale = resolve_sm_scale(sm_scale, d)
        tiles = self._tile_map(plan, q, kv, qo_indptr, dt, d, params, extras, fp8)
        group = int(q.shape[1]) // kv.num_kv_heads
        # the Hopper template's order (or a tile map's), else the mma.sync split's section where one serves
        hopper = plan.kernel != PrefillTemplate.MMA_SYNC and "sm_90a" in self.manifest["config"]["archs"] \
            and _hopper_device(q.device)
        order = plan.work_order(self.variant, group, d, q.device, tiles, kv_scaled=fp8 is not None,
                                kv_heads=kv.num_kv_heads) if hopper or tiles is not None else None
        if not hopper and tiles is None:
            order = plan.mma_split_order(group, d, kv.num_kv_heads, q.device)
        workspace = None if fp8 is not None else hook_pass_module.workspace_for(
            self.variant, plan.hook_pass, plan.max_qo_len * group, q, kv, d)
        fn(q, *kv_args, qo_indptr, out, lse, *scales, scale, *plan.ffi_args(tiles, order, workspace), *extras)
        if plan.guards_replays and hasattr(out, "masked_fill_"):  # (a replayed batch may pass the bound)
            poison_rows_over_bound(out, lse, qo_indptr, plan.replay_rows(qo_indptr.device), max_qo_len=plan.max_qo_len)
        return out, lse
