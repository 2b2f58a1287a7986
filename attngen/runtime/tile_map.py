"""Mask-derived tile maps of prefill plans: the block structure of a variant's mask, found on the device.

A mask the static analysis reduces to bounds (causal, sliding window) already limits each CTA's key range.
Any other mask (document ids of packed sequences, prefix-LM, bit masks) would otherwise have every tile
computed and its mask evaluated on every score. ``build_tile_map`` runs the library's classifier
(``prefill_tile_map_<dtype>_d<D>``, csrc/tile_map.cuh) over the Hopper template's tiling: each
(request, query tile, key tile) is empty (skipped), full (run without the mask hook) or partial. The map
is compacted on the device into one list of non-empty key tiles per (request, head row, query tile),
entries ``key_tile * 2 + full``, which both prefill templates walk (the mma.sync template's smaller tiles
take the class of the map tile they lie in); every layer that reuses the plan reuses the map. The classifier
also records whether each map row's visible keys form one interval, and which (``row_keys``, after the lists
in the same tensor): a partial tile whose rows all see intervals runs two compares per score instead of the
mask hook (a document mask with causal attention inside each document, a prefix-LM). A map depends on the
parameters the mask reads, so the plan keys its map by them (tensors by object, version and data pointer, checked
by weak reference; scalars by value): a call with other tensors or scalars, or with the same tensors changed in
place, derives a new map.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from .views import PagedKV
from .work_order import order_from_map, order_from_pair_tiles


def mask_reads_heads(variant) -> bool:
    return variant.analysis.mask_reads_heads


def mask_params(variant) -> tuple[str, ...]:
    """The parameters the mask hook reads (the map is valid for their values only)."""
    reads = variant.analysis.reads.get("logits_mask")
    return tuple(reads.params) if reads is not None else ()


def params_key(variant, params: dict | None) -> tuple:
    """The mask's parameters a map was made from: tensors by object, version and data pointer (an id alone
    would not do: a freed tensor's may come back for a new one, which ``TileMap.made_from`` tells apart), and
    scalars by value (None: the default)."""
    params = params or {}
    key = []
    for name in mask_params(variant):
        value = params.get(name)
        if hasattr(value, "shape"):
            key.append((name, id(value), getattr(value, "_version", None),
                        value.data_ptr() if hasattr(value, "data_ptr") else None))
        else:
            try:
                hash(value)
            except TypeError:  # (a list for a scalar: the call's checks refuse it, the key only needs to differ)
                value = repr(value)
            key.append((name, value))
    return tuple(key)


def param_refs(variant, params: dict | None) -> tuple:
    """(name, weak reference) of each mask tensor parameter: whether a map's tensors are the call's."""
    params = params or {}
    refs = []
    for name in mask_params(variant):
        if hasattr(params.get(name), "shape"):
            try:
                refs.append((name, weakref.ref(params[name])))
            except TypeError:  # (no weak reference: then every call's tensor counts as another)
                refs.append((name, lambda: None))
    return tuple(refs)


@dataclass(frozen=True)
class TileMap:
    indptr: Any   # [batch * heads * q_tiles + 1] int32 (device): each list's first entry
    entries: Any  # int32 (device): key tile * 2 + 1 if full, the lists in the first indptr[-1]; then row_keys
    heads: int    # 1: one map for every KV head (the mask reads no head index), else num_kv_heads
    rows: int     # the tiling: packed query rows and keys per tile
    keys: int
    params_key: tuple  # the mask's parameters the map was made from (params_key)
    class_counts: Any = None  # [3] int64 (device): tiles by class (empty, partial, full), read by `counts`
    build_host_ms: float = 0.0  # host wall time of the derivation's calls (without a final synchronisation)
    # that wall time by step, ((step, ms), ...): sizes and allocation, the classifier's call, the lists and order
    build_host_steps: tuple = ()
    order: Any = None  # [batch * q_tiles] int32 (device): the pairs by their tiles, longest first (work_order.py)
    build_events: Any = None  # CUDA events around the derivation (None for host tensors)
    param_refs: tuple = ()  # (name, weak reference) of the mask's tensors the map was made from (param_refs)
    row_keys: Any = None  # [lists, rows, 2] int32, a view of entries' end: each map row's visible keys [lo, hi]
    #                       ((0, -1): none or past the request; (-1, -1): not one interval); map rows are tokens
    #                       of a head-free map (from the tile's first row // group), else packed rows

    def made_from(self, params: dict | None) -> bool:
        """Whether the call's mask tensors are the very objects this map was made from (its key matched)."""
        params = params or {}
        return all(ref() is params.get(name) for name, ref in self.param_refs)

    @property
    def build_ms(self) -> float:
        """The derivation's time on the device's stream (classifier and compaction, with any gap the host left;
        a device read, for reports), or its host wall time where it ran on host tensors."""
        if self.build_events is None:
            return self.build_host_ms
        start, end = self.build_events
        end.synchronize()
        return float(start.elapsed_time(end))

    @property
    def counts(self) -> dict:
        """Tiles by class, {"empty": n, "partial": n, "full": n} (a device read: for reports, not call paths)."""
        if self.class_counts is None:
            return {}
        return dict(zip(("empty", "partial", "full"), (int(n) for n in self.class_counts.tolist())))

    def ffi_args(self) -> tuple:
        """What the prefill entries take after ``kernel`` (csrc/entry_prefill.h): indptr, entries, heads."""
        return (self.indptr, self.entries, self.heads)


class KVBound:
    """A batch's longest KV length and the index arrays it comes from (held weakly, with their versions and data
    pointers): a map built for a view with those arrays, unchanged by PyTorch since, takes its width from here
    instead of reading the device. An id alone would not do: a freed tensor's may come back for a new one.
    Arrays rewritten behind PyTorch's back (a CUDA graph replay, another library's kernel) need a new plan."""

    def __init__(self, kv, longest: int):
        self.longest = longest
        self.page_size = kv.page_size if isinstance(kv, PagedKV) else None
        arrays = self._arrays(kv)
        self.refs = tuple(weakref.ref(t) for t in arrays)
        self.marks = tuple(self._mark(t) for t in arrays)

    @classmethod
    def of(cls, kv, longest: int) -> KVBound | None:
        """The bound, or None where an index array takes no weak reference (the map then reads the lengths)."""
        try:
            return cls(kv, longest)
        except TypeError:
            return None

    @staticmethod
    def _arrays(kv) -> tuple:
        return (kv.indptr, kv.last_page_len) if isinstance(kv, PagedKV) else (kv.indptr,)

    @staticmethod
    def _mark(t) -> tuple:
        return (getattr(t, "_version", None), t.data_ptr() if hasattr(t, "data_ptr") else None)

    def max_len(self, kv) -> int | None:
        """The longest KV length when ``kv`` has the bound's index arrays, unchanged since; else None."""
        if (kv.page_size if isinstance(kv, PagedKV) else None) != self.page_size:
            return None
        arrays = self._arrays(kv)
        same = len(arrays) == len(self.refs) and all(
            ref() is t and self._mark(t) == mark for ref, t, mark in zip(self.refs, arrays, self.marks))
        return self.longest if same else None


def kv_lengths(kv):
    """[B] int32 device tensor of each request's KV length, from a paged or ragged view."""
    import torch

    if isinstance(kv, PagedKV):
        pages = torch.diff(kv.indptr)
        return torch.where(pages > 0, (pages - 1) * kv.page_size + kv.last_page_len, 0).to(torch.int32)
    return torch.diff(kv.indptr).to(torch.int32)


def build_tile_map(classify, variant, qo_indptr, kv, *, max_qo_len: int, group: int, num_kv_heads: int,
                   rows: int, keys: int, extras: tuple, params: dict | None,
                   max_kv_len: int | None = None, device_lists: bool = False) -> TileMap:
    """Run the classifier ``classify`` (the library's prefill_tile_map function) and compact its map.
    ``max_kv_len``: the batch's longest KV length where the caller knows it (the plan's host copies); else
    it is read from the device (a synchronisation). ``device_lists``: the classifier's call also makes the
    lists, counts and the pairs' tiles (csrc/tile_map.cuh tile_lists_kernel: one launch instead of the tensor
    calls of compact_lists and the counts, and the work order where it fits ORDER_BINS)."""
    import time

    import torch

    start = time.perf_counter()
    marks = [start]
    events = None
    if qo_indptr.is_cuda:
        events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        events[0].record()
    batch = int(qo_indptr.shape[0]) - 1
    if max_kv_len is None:
        max_kv_len = int(kv_lengths(kv).max().item()) if batch else 0
    # the view's own index arrays: the classifier computes each request's keys from them
    paged = isinstance(kv, PagedKV)
    kv_arrays = (kv.indptr, kv.last_page_len, kv.page_size) if paged else (kv.indptr, None, 0)
    heads = num_kv_heads if mask_reads_heads(variant) else 1
    q_tiles = -(-max_qo_len * group // rows)
    k_tiles = -(-max_kv_len // keys)
    lists = batch * heads * q_tiles
    pairs = batch * q_tiles
    dev = qo_indptr.device
    cls = torch.empty((batch, heads, q_tiles, k_tiles), dtype=torch.uint8, device=dev)  # (the classifier fills it)
    # one zero-filled tensor: the device lists' outputs (indptr, the pairs' tiles, the counts by class, the work
    # order; padded to 32 entries), then entries: the lists' room, then the map rows' key intervals, which the
    # prefill kernels find at entries' end and read as int2 (they start on 128 bytes) and the classifier writes
    at_tiles, at_counts = lists + 1, lists + 1 + pairs  # where each output starts (indptr at 0)
    at_order = at_counts + 3
    made_size = at_order + pairs
    head = (made_size + 31) // 32 * 32 if device_lists else 0
    room = list_room(lists * k_tiles)
    buf = torch.zeros(head + room + lists * rows * 2, dtype=torch.int32, device=dev)  # (slots no list fills: 0)
    entries = buf[head:]
    row_keys = entries[room:].view(lists, rows, 2)
    if not cls.numel():  # (the classifier writes every row's interval; without a launch every row sees none)
        row_keys.view(torch.int64).fill_(ROW_SEES_NONE)
    made = buf[:made_size] if device_lists else None
    marks.append(time.perf_counter())
    if cls.numel():
        classify(qo_indptr, *kv_arrays, cls, row_keys, made, entries[:room] if device_lists else None, group,
                 num_kv_heads, 0, rows, keys, *extras)
    marks.append(time.perf_counter())
    if device_lists:  # (a map without tiles launched nothing: its zeros stand)
        indptr, tiles, class_counts = made[:at_tiles], made[at_tiles:at_counts], made[at_counts:at_order]
        # the kernel's counting sort made the order where its counts fit (else, and without a launch, sort here)
        ranked = cls.numel() and heads * k_tiles + 1 <= ORDER_BINS
        order = made[at_order:] if ranked else order_from_pair_tiles(tiles)
    else:
        flat = cls.reshape(lists, k_tiles)  # explicit: -1 is ambiguous when k_tiles is 0
        indptr, _ = compact_lists(flat, out=entries[:room])
        # tiles by class, without a host synchronisation (bincount would read the map's maximum): read when
        # reported
        listed = indptr[-1].to(torch.int64)
        full = (flat == 2).sum()
        class_counts = torch.stack((lists * k_tiles - listed, listed - full, full))
        order = order_from_map(indptr, batch=batch, heads=heads, q_tiles=q_tiles)
    if events is not None:
        events[1].record()
    marks.append(time.perf_counter())
    steps = tuple((name, (b - a) * 1e3) for name, a, b in zip(("setup", "classifier call", "lists and order"),
                                                             marks, marks[1:]))
    return TileMap(indptr, entries, heads, rows, keys, params_key(variant, params), class_counts,
                   (marks[-1] - start) * 1e3, steps, order, events, param_refs(variant, params), row_keys)


# the values of a pair's listed tiles (0 .. heads * k_tiles) the lists kernel's counting sort counts
# (csrc/tile_map.cuh kOrderBins): a map of more key tiles over its head rows has its order sorted by PyTorch
ORDER_BINS = 4096

# a row key interval (lo, hi) = (0, -1), "no key", as one little-endian int64 (lo in the low word)
ROW_SEES_NONE = -(1 << 32)


def list_room(tiles: int) -> int:
    """The lists' room in entries for a map of ``tiles`` tiles: one slot per tile and one for the empty tiles'
    values (compact_lists), rounded up to 32 entries, so that the row intervals after it start on 128 bytes
    (the kernels read them as int2: 8 bytes at least)."""
    return (tiles + 32) // 32 * 32


def compact_lists(flat, out=None):
    """flat [lists, k_tiles] uint8 TileClass -> (indptr [lists + 1] int32, entries int32): each list's
    non-empty key tiles in order, ``key_tile * 2 + full``, in entries[indptr[l]:indptr[l + 1]]. Without a
    host synchronisation: every tile's place is a running count of the non-empty ones, the empty tiles' values
    go to a slot past the lists (entries keeps a slot per tile and that one; those past indptr[-1] are not
    read). ``out``: an int32 tensor of at least list_room(flat.numel()) entries to fill (else one is made)."""
    import torch

    lists, k_tiles = flat.shape
    n = flat.numel()
    if out is None:
        out = torch.empty(list_room(n), dtype=torch.int32, device=flat.device)
    live = flat != 0
    indptr = torch.zeros(lists + 1, dtype=torch.int32, device=flat.device)
    torch.cumsum(live.sum(1, dtype=torch.int32), 0, dtype=torch.int32, out=indptr[1:])
    if n == 0:
        return indptr, out[:0]
    live = live.view(-1)
    place = torch.cumsum(live, 0).sub_(1).masked_fill_(~live, n)
    values = torch.arange(0, 2 * k_tiles, 2, dtype=torch.int32, device=flat.device).add(flat == 2)
    out.scatter_(0, place, values.view(-1))
    return indptr, out[:n]
