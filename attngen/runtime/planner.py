"""The split-KV planner from Python: declared capacity, preallocated outputs, one host call per batch step.

The plan is the paper's Algorithm 2 (see ``attngen/csrc/planner.h``). Its output buffers
are sized once from declared upper bounds, so a plan never allocates; exceeding a bound
raises an error naming it.

Options cross into C++ as named fields, never positions: ``PlannerCapacity`` once per planner,
``PlanRequest`` per plan call and ``PackedLayout`` per packing, each a frozen dataclass that
``named_options`` turns into the map ``csrc/planner_ffi.cc`` reads by key. The packed decode plan
(the buffer the tensor-core decode template reads) is written by the C++ packer only; its layout is
documented once, in ``csrc/decode_plan_pack.h``, and Python sizes buffers for it through
``plan_layout_ints``.
"""
from __future__ import annotations

import dataclasses
import functools
import numbers
from dataclasses import dataclass

import numpy as np
import tvm_ffi

from attngen.build import support_library
from attngen.schedules.cost_model import cost_coefficients

from .checks import AttentionArgumentError


@dataclass(frozen=True)
class PlannerCapacity:
    max_batch: int
    max_work_items: int
    max_partials: int
    max_merge_tiles: int
    max_ctas: int = 1024


@dataclass(frozen=True)
class PlanRequest:
    """The options of one plan call (the C++ ``PlanInput`` less its length vectors)."""

    num_ctas: int  # C: plan columns
    alpha: float  # cost model: alpha * rows + beta * keys (attngen.schedules.cost_model)
    beta: float
    group: int = 1  # query heads per KV head
    tile_rows: int = 16  # query rows per tile
    fixed_chunk: int = 0  # > 0: chunks of exactly this many keys (batch-invariant); 0: balanced
    min_chunk: int = 1  # the chunk limit never drops below it
    mask_lower: int | None = None  # bounds on qo_pos - kv_pos of visible keys; None: unbounded
    mask_upper: int | None = None


@dataclass(frozen=True)
class PackedLayout:
    """Where the packed decode plan puts its sections (``csrc/decode_plan_pack.h``). ``mode``: "bounded"
    (offsets fixed by the planner's capacity: a CUDA graph replays any later plan) or "compact" (sections as
    long as the plan's). ``merge_counter_heads`` > 0 reserves the fused merge's counters (max merges x that
    many KV heads) after the sections; ``fused_merge`` points the header at them."""

    mode: str = "bounded"
    merge_counter_heads: int = 0
    fused_merge: bool = False


@dataclass
class SplitKVPlan:
    cta_indptr: np.ndarray  # [C+1] work items of CTA c are work[cta_indptr[c]:cta_indptr[c+1]]
    work: np.ndarray  # [n, 5]: request, query tile, kv start, kv end, partial slot (-1: writes the output)
    merge_tiles: np.ndarray  # [m, 2]: request, query tile of each split tile
    merge_indptr: np.ndarray  # [m+1]
    merge_partials: np.ndarray  # partial slots to merge, in KV order, per split tile
    chunk_limit: int
    host_ns: int  # time the C++ planner took


def _plain(value):
    """A field value as the FFI map holds it (NumPy scalars become Python numbers)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value)


def named_options(options) -> tvm_ffi.Map:
    """A frozen options dataclass as the map of named values the planner library reads by key."""
    return tvm_ffi.Map({f.name: _plain(getattr(options, f.name)) for f in dataclasses.fields(options)})


@functools.lru_cache(maxsize=None)
def planner_library(cache=None) -> tvm_ffi.Module:
    """The planner's shared library, built (or found in the build cache) through ``attngen.build``."""
    return tvm_ffi.load_module(str(support_library("planner", cache=cache)))


def plan_layout_ints(capacity: PlannerCapacity, layout: PackedLayout, *, cache=None) -> int:
    """Entries (int32) of a bounded packed plan buffer for ``capacity``, counters included."""
    return int(planner_library(cache)["plan_layout_ints"](named_options(capacity), named_options(layout)))


class SplitKVPlanner:
    def __init__(self, capacity: PlannerCapacity, *, template: str = "decode", cache=None):
        self.capacity = capacity
        self.alpha, self.beta = cost_coefficients(template)
        c = capacity
        self._cta_indptr = np.zeros(c.max_ctas + 1, np.int32)
        self._work = np.zeros(c.max_work_items * 5, np.int32)
        self._merge_tiles = np.zeros(max(c.max_merge_tiles, 1) * 2, np.int32)
        self._merge_indptr = np.zeros(c.max_merge_tiles + 1, np.int32)
        self._merge_partials = np.zeros(max(c.max_partials, 1), np.int32)
        outputs = {"cta_indptr": self._cta_indptr, "work": self._work, "merge_tiles": self._merge_tiles,
                   "merge_indptr": self._merge_indptr, "merge_partials": self._merge_partials}
        self._cache = cache
        lib = planner_library(cache)
        self._capacity = named_options(capacity)
        native = lib["split_kv_planner"](self._capacity,
                                         tvm_ffi.Map({k: tvm_ffi.from_dlpack(v) for k, v in outputs.items()}))
        self._plan, self._pack, self._decode_packed = native["plan"], native["pack"], lib["plan_decode_packed"]
        self._requests: dict[tuple, tvm_ffi.Map] = {}  # plan() keywords -> their PlanRequest's named options
        self._layouts: dict[PackedLayout, tvm_ffi.Map] = {}
        self._last: SplitKVPlan | None = None  # the plan the C++ side keeps for pack()

    def request(self, *, num_ctas: int, group: int = 1, tile_rows: int = 16, fixed_chunk: int = 0,
                mask_lower: int | None = None, mask_upper: int | None = None, min_chunk: int = 1) -> PlanRequest:
        """The PlanRequest of ``plan``'s keywords under this planner's cost model."""
        return PlanRequest(num_ctas, self.alpha, self.beta, group=group, tile_rows=tile_rows, fixed_chunk=fixed_chunk,
                           min_chunk=min_chunk, mask_lower=mask_lower, mask_upper=mask_upper)

    def plan(self, qo_len, kv_len, *, num_ctas: int, group: int = 1, tile_rows: int = 16,
             fixed_chunk: int = 0, mask_lower: int | None = None, mask_upper: int | None = None,
             min_chunk: int = 1) -> SplitKVPlan:
        """qo_len, kv_len: [B] per-request lengths. ``fixed_chunk`` > 0 makes chunk boundaries
        independent of the rest of the batch (batch-invariant results). ``min_chunk``: the chunk limit
        never drops below it (a work item has a fixed cost; tiny chunks do not pay for it)."""
        # a batch step repeats the last step's options: their named map is made once
        key = (num_ctas, group, tile_rows, fixed_chunk, mask_lower, mask_upper, min_chunk)
        request = self._requests.get(key)
        if request is None:
            if len(self._requests) >= 64:
                self._requests.clear()
            request = self._requests[key] = named_options(self.request(
                num_ctas=num_ctas, group=group, tile_rows=tile_rows, fixed_chunk=fixed_chunk, mask_lower=mask_lower,
                mask_upper=mask_upper, min_chunk=min_chunk))
        qo = np.ascontiguousarray(qo_len, dtype=np.int32)
        kv = np.ascontiguousarray(kv_len, dtype=np.int32)
        self._last = None
        try:
            out = self._plan(request, qo, kv)
        except (ValueError, TypeError) as e:
            raise AttentionArgumentError(str(e)) from None
        n_work, n_merge = out["work_items"], out["merges"]
        self._last = SplitKVPlan(self._cta_indptr[:num_ctas + 1].copy(), self._work[:n_work * 5].reshape(-1, 5).copy(),
                                 self._merge_tiles[:n_merge * 2].reshape(-1, 2).copy(),
                                 self._merge_indptr[:n_merge + 1].copy(),
                                 self._merge_partials[:out["partials"]].copy(), out["chunk_limit"], out["host_ns"])
        return self._last

    def layout_ints(self, layout: PackedLayout) -> int:
        """Entries (int32) of a bounded packed plan buffer for this planner's capacity."""
        return plan_layout_ints(self.capacity, layout, cache=self._cache)

    def pack(self, plan: SplitKVPlan, buf, layout: PackedLayout) -> int:
        """Write ``plan`` (this planner's latest) into ``buf`` (int32 host vector or a tvm_ffi view of one) as
        ``layout`` places it, by the C++ packer; returns the entries the layout spans."""
        if plan is not self._last:
            raise AttentionArgumentError("plan: not this planner's latest plan (only that one can be packed); "
                                         "plan again")
        named = self._layouts.get(layout)
        if named is None:
            named = self._layouts[layout] = named_options(layout)
        try:
            return int(self._pack(buf, named)["ints"])
        except (ValueError, TypeError) as e:
            raise AttentionArgumentError(str(e)) from None

    def plan_decode_packed(self, kv_len, buf: np.ndarray, *, num_ctas: int, group: int, fixed_chunk: int = 0,
                           min_chunk: int = 1) -> tuple[int, int]:
        """A decode plan (one query row per request) planned and packed by the two calls TVM's decode plan
        slot makes (compact offsets) into ``buf`` (int32); returns (entries written, merges)."""
        request = named_options(self.request(num_ctas=num_ctas, group=group, fixed_chunk=fixed_chunk,
                                             min_chunk=min_chunk))
        try:
            out = self._decode_packed(request, self._capacity, np.ascontiguousarray(kv_len, dtype=np.int32), buf)
        except (ValueError, TypeError) as e:
            raise AttentionArgumentError(str(e)) from None
        return int(out["ints"]), int(out["merges"])
