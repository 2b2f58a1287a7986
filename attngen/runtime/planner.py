"""The split-KV planner from Python: declared capacity, preallocated outputs, one host call per batch step.

The plan is the paper's Algorithm 2 (see ``attngen/csrc/planner.h``). Its output buffers
are sized once from declared upper bounds, so a plan never allocates; exceeding a bound
raises an error naming it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm_ffi

from attngen.schedules.cost_model import cost_coefficients

from .checks import AttentionArgumentError


@dataclass(frozen=True)
class PlannerCapacity:
    max_batch: int
    max_work_items: int
    max_partials: int
    max_merge_tiles: int
    max_ctas: int = 1024


@dataclass
class SplitKVPlan:
    cta_indptr: np.ndarray  # [C+1] work items of CTA c are work[cta_indptr[c]:cta_indptr[c+1]]
    work: np.ndarray  # [n, 5]: request, query tile, kv start, kv end, partial slot (-1: writes the output)
    merge_tiles: np.ndarray  # [m, 2]: request, query tile of each split tile
    merge_indptr: np.ndarray  # [m+1]
    merge_partials: np.ndarray  # partial slots to merge, in KV order, per split tile
    chunk_limit: int
    host_ns: int  # time the C++ planner took


class SplitKVPlanner:
    def __init__(self, capacity: PlannerCapacity, *, template: str = "decode", cache=None):
        from attngen.codegen.host_library import build_planner_library

        self.capacity = capacity
        self.alpha, self.beta = cost_coefficients(template)
        lib = tvm_ffi.load_module(str(build_planner_library(cache)))
        self._fn, self._packed = lib["plan_split_kv"], lib["plan_decode_packed"]
        c = capacity
        self._cta_indptr = np.zeros(c.max_ctas + 1, np.int32)
        self._work = np.zeros(c.max_work_items * 5, np.int32)
        self._merge_tiles = np.zeros(max(c.max_merge_tiles, 1) * 2, np.int32)
        self._merge_indptr = np.zeros(c.max_merge_tiles + 1, np.int32)
        self._merge_partials = np.zeros(max(c.max_partials, 1), np.int32)

    def plan_decode_packed(self, kv_len, buf: np.ndarray, *, num_ctas: int, group: int, fixed_chunk: int = 0,
                           min_chunk: int = 1) -> tuple[int, int]:
        """A decode plan (one query row per request) packed by the C++ packer TVM's decode plan slot uses
        (compact offsets) into ``buf`` (int32); returns (entries written, merges)."""
        c = self.capacity
        try:
            n, merges = self._packed(np.ascontiguousarray(kv_len, dtype=np.int32), group, num_ctas, self.alpha,
                                     self.beta, fixed_chunk, min_chunk, c.max_work_items, c.max_partials,
                                     c.max_merge_tiles, buf)
        except ValueError as e:
            raise AttentionArgumentError(str(e)) from None
        return int(n), int(merges)

    def plan(self, qo_len, kv_len, *, num_ctas: int, group: int = 1, tile_rows: int = 16,
             fixed_chunk: int = 0, mask_lower: int | None = None, mask_upper: int | None = None,
             min_chunk: int = 1) -> SplitKVPlan:
        """qo_len, kv_len: [B] per-request lengths. ``fixed_chunk`` > 0 makes chunk boundaries
        independent of the rest of the batch (batch-invariant results). ``min_chunk``: the chunk limit
        never drops below it (a work item has a fixed cost; tiny chunks do not pay for it)."""
        qo = np.ascontiguousarray(qo_len, dtype=np.int32)
        kv = np.ascontiguousarray(kv_len, dtype=np.int32)
        if qo.shape != kv.shape or qo.ndim != 1:
            raise AttentionArgumentError("qo_len, kv_len: expected two [batch_size] vectors of the same length")
        if len(qo) > self.capacity.max_batch:
            raise AttentionArgumentError(f"max_batch: the batch has {len(qo)} requests, the planner was sized for "
                                         f"{self.capacity.max_batch}")
        if not 0 < num_ctas <= self.capacity.max_ctas:
            raise AttentionArgumentError(f"num_ctas: {num_ctas} is outside 1..max_ctas={self.capacity.max_ctas}")
        c = self.capacity
        try:
            n_work, n_part, n_merge, chunk, ns = self._fn(
                qo, kv, group, tile_rows, num_ctas, self.alpha, self.beta, fixed_chunk, mask_lower is not None,
                mask_lower or 0, mask_upper is not None, mask_upper or 0, c.max_work_items, c.max_partials,
                c.max_merge_tiles, self._cta_indptr, self._work, self._merge_tiles, self._merge_indptr,
                self._merge_partials, min_chunk)
        except ValueError as e:
            raise AttentionArgumentError(str(e)) from None
        return SplitKVPlan(self._cta_indptr[:num_ctas + 1].copy(), self._work[:n_work * 5].reshape(-1, 5).copy(),
                           self._merge_tiles[:n_merge * 2].reshape(-1, 2).copy(),
                           self._merge_indptr[:n_merge + 1].copy(), self._merge_partials[:n_part].copy(),
                           int(chunk), int(ns))
