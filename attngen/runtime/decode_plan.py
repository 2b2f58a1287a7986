"""Load-balanced split-KV decode: the planner's work list in a fixed device workspace.

``DecodeWorkspace`` is sized once from declared bounds (batch, CTAs) and holds the device
buffer the tensor-core decode template reads its work list from, the partial-state buffers
of split requests, and a pinned host staging buffer. ``split`` runs the host planner
(Algorithm 2: chunks no longer than total work / CTAs, longest first onto the least-loaded
CTA); ``fill`` has the C++ packer write that plan into the staging buffer and issues one
asynchronous host-to-device copy on the current stream; it never synchronises the device except
to wait for the previous copy out of the same staging buffer. The buffer's layout is the one
``csrc/decode_plan_pack.h`` documents (read on the device by ``DecodePlanView`` in
``csrc/decode.cuh``), bounded: every offset is fixed by the workspace's bounds, so a captured CUDA
graph reads any later plan.

With counters (a workspace made for ``num_kv_heads``), the decode kernel merges split requests itself:
the CTA that writes a request's last partial state merges them, and no merge kernel is launched. The
counters are zero between launches (the merging CTA resets its own; every plan copy rewrites them).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from attngen.schedules.cost_model import decode_min_chunk
from attngen.schedules.dtypes import ElementBytes
from attngen.schedules.template_decode_tc import DECODE_TC, MAX_GROUP, pairs_kv_heads, stage_order

from .checks import AttentionArgumentError
from .planner import PackedLayout, PlannerCapacity, SplitKVPlanner, plan_layout_ints


@dataclass(frozen=True)
class DecodeBounds:
    """Declared upper bounds a decode workspace is sized for; exceeding one is an error naming it."""

    max_batch: int
    num_ctas: int  # plan columns (CTAs per KV head)
    min_work_items: int = 0  # more items than B + C: fixed-chunk plans (see items_needed)

    @property
    def max_work_items(self) -> int:
        # chunks <= ceil(len / limit) per request and sum(len) / limit <= C, so items <= B + C when the
        # limit is at least total / C; a fixed chunk can need more (items_needed)
        return max(self.max_batch + self.num_ctas, self.min_work_items)

    @property
    def max_partials(self) -> int:
        return self.max_work_items

    @property
    def max_merges(self) -> int:
        return self.max_batch

    @property
    def capacity(self) -> PlannerCapacity:
        """The planner capacity of these bounds (its plan columns are the workspace's CTAs)."""
        return PlannerCapacity(self.max_batch, self.max_work_items, self.max_partials, self.max_merges,
                               max_ctas=self.num_ctas)


def items_needed(kv_lens: np.ndarray, fixed_chunk: int) -> int:
    """Work items a fixed-chunk plan of these lengths makes (every request at least one)."""
    lens = np.asarray(kv_lens, np.int64)
    return int(np.maximum(1, -(-lens // fixed_chunk)).sum()) if fixed_chunk > 0 else 0


class DecodeWorkspace:
    """Device and pinned buffers of one decode shape (heads, head_dim) under declared bounds."""

    def __init__(self, bounds: DecodeBounds, num_qo_heads: int, head_dim: int, device, *, cache=None,
                 num_kv_heads: int = 0, resident_slots: int = 0):
        import torch

        self.bounds, self.num_qo_heads, self.head_dim = bounds, num_qo_heads, head_dim
        self.resident_slots = resident_slots  # CTAs of this template the GPU holds at once
        self.has_counters = num_kv_heads > 0  # the fused merge's arrival counters: plans may fuse the merge
        self.planner = SplitKVPlanner(bounds.capacity, template="decode", cache=cache)
        self._layouts = {fused: PackedLayout("bounded", num_kv_heads, fused) for fused in (False, self.has_counters)}
        total = self.planner.layout_ints(self._layouts[False])
        self.device_plan = torch.zeros(total, dtype=torch.int32, device=device)
        self._host = torch.zeros(total, dtype=torch.int32, pin_memory=True)
        self._host_np = self._host.numpy()
        self._copied = None  # event after the last copy out of the staging buffer
        self.generation = 0  # fills so far: a plan remembers its own and is refused once superseded
        self.graph_safe = False  # a graph-safe plan was made here: a captured graph may read these buffers
        self.part_o = torch.empty((bounds.max_partials, num_qo_heads, head_dim), dtype=torch.float32, device=device)
        self.part_lse = torch.empty((bounds.max_partials, num_qo_heads), dtype=torch.float32, device=device)

    def split(self, kv_lens: np.ndarray, group: int, *, fixed_chunk: int = 0):
        """The host plan of one batch step (kv_lens [B]) over this workspace's CTAs, without filling it."""
        b = self.bounds
        if len(kv_lens) > b.max_batch:
            raise AttentionArgumentError(f"max_batch: the batch has {len(kv_lens)} requests, the decode workspace "
                                         f"was sized for {b.max_batch}")
        return self.planner.plan(np.ones(len(kv_lens), np.int32), kv_lens, num_ctas=b.num_ctas, group=group,
                                 tile_rows=16, fixed_chunk=fixed_chunk,
                                 min_chunk=decode_min_chunk(self.head_dim, kv_lens, b.num_ctas))

    def fill(self, plan, *, fused_merge: bool | None = None, graph_safe: bool = False):
        """Copy ``plan`` (this step's host plan, from ``split``) to the device; returns (number of merges,
        whether the decode kernel merges). ``fused_merge`` and ``graph_safe``: as
        ``choose_fused_merge`` takes them (a workspace without counters never fuses)."""
        import torch

        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copy must have left the staging buffer
        fused = self.has_counters and choose_fused_merge(plan.work, fused_merge, graph_safe=graph_safe)
        self.planner.pack(plan, self._host_np, self._layouts[fused])
        self.device_plan.copy_(self._host, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return len(plan.merge_tiles), fused


def grid_chunks_for_uniform_batch(kv_lens: np.ndarray, plan, num_kv_heads: int, resident_slots: int) -> int:
    """Chunks per request of an even-split grid launch that serves a uniform batch (every request the same
    length) at least as well as the load-balanced ``plan`` (a SplitKVPlan of one KV head's columns); 0 keeps
    the plan. The grid launch needs no work list, so each CTA starts one dependent global load sooner, and
    the hardware refills every SM as CTAs finish, where the plan's CTAs per KV head are a floor that can
    leave slots empty. Two shapes qualify (H200, bf16, D 128; ``decode_2026-11-30*.md``, columns "TC even"
    against the plan; the rule measured in ``decode_2026-11-30_autogrid*.md``):
    - the plan gives every CTA at most one item: the even split of the same chunk count is the same
      partition (B 1 L 64k: 3893 / 3818 GB/s against 3834 / 3780 in two runs);
    - no request is split, the batch fills at least two waves of the GPU's slots, and the plan's CTAs
      leave 2% or more of the slots empty (MHA B 32 L 4k, 8 CTAs per head for 32 heads on 264 slots:
      4565 / 4474 against 4499 / 4396).
    Short items packed several per CTA stay with the plan (B 64 L 1k: the plan is 1% faster)."""
    lens = np.asarray(kv_lens)
    if len(lens) == 0 or lens.min() != lens.max() or lens[0] <= 0:
        return 0
    items = len(plan.work)
    if items % len(lens):
        return 0
    per_request = items // len(lens)
    columns = len(plan.cta_indptr) - 1
    if int(np.diff(plan.cta_indptr).max(initial=0)) <= 1:
        return per_request
    if (per_request == 1 and len(lens) * num_kv_heads >= 2 * resident_slots
            and columns * num_kv_heads < 0.98 * resident_slots):
        return 1
    return 0


# The automatic pairing's batches (H100, fp8 / bf16, 3 rounds, kv_pairs_2026-12-05_h100.md): pairs gained 4-20% on
# batches of many equal requests (B 64 L 4k, B 16 L 16k, D 64) and lost 9-12% where a CTA's doubled rows left the
# GPU short of parallel work (B 1 L 2k at D 64) or one long request among short ones (1 x 32k + 63 x 512); B 1 L 64k
# level. So: at least this many (token, KV head) pairs in the batch, and no request above PAIR_MAX_SKEW x the mean.
PAIR_MIN_TOKEN_HEADS = 1 << 18
PAIR_MAX_SKEW = 4.0


def kv_heads_per_cta(requested: int | None, *, head_dim: int, kv_bytes: int, layout: str, num_kv_heads: int,
                     group: int, tensor_cores: Callable[[], bool], kv_lens=None, adjacent_heads: bool = True) -> int:
    """KV heads one tensor-core decode CTA serves: 1, or 2 (a pair: csrc/decode_tc_tile.cuh
    decode_tc_pairs_kv_heads). A pair needs rows of at most 128 bytes (an fp8 cache at D 64 / 128, a 16-bit one at
    D 64), an even number of KV heads, a group of at most half the tile's query rows and the tensor-core
    template (``tensor_cores()``: whether the call runs on it, asked last). ``requested`` None pairs wherever it
    may on an NHD cache, whose pair's rows of a token are adjacent (its copies read runs of twice a row's bytes;
    an HND cache's rows of one head already run page-long), for a batch of ``kv_lens`` [B] with enough work and
    no request far longer than the rest (PAIR_MIN_TOKEN_HEADS, PAIR_MAX_SKEW); 1 / 2 decide, 2 refused where a
    pair cannot serve the call. The plan is then made for ``num_kv_heads / 2`` heads of twice the group.
    ``adjacent_heads`` False (an NHD pool whose heads lie apart, kv_pool.py): never paired automatically."""
    if requested not in (None, 1, 2):
        raise AttentionArgumentError(f"kv_heads_per_cta: must be 1, 2 or None (automatic), got {requested!r}")
    if requested == 1 or (requested is None and (layout != "NHD" or not adjacent_heads)):
        return 1
    fits = (pairs_kv_heads(head_dim, kv_bytes) and num_kv_heads % 2 == 0 and 2 * group <= MAX_GROUP
            and tensor_cores())
    if requested is None:
        return 2 if fits and _pairs_pay(kv_lens, num_kv_heads) else 1
    if not fits:
        where = "" if tensor_cores() else (", not surely on the tensor-core template (it takes a pair with "
                                           "tensor_cores=True or a load-balanced plan)")
        raise AttentionArgumentError(
            f"kv_heads_per_cta=2: pairs KV heads on the tensor-core template where rows are at most 128 bytes (an "
            f"fp8 cache at head_dim <= 128, a 16-bit one at head_dim 64), the KV heads are even and the group is at "
            f"most {MAX_GROUP // 2}; this call has head_dim {head_dim}, {kv_bytes}-byte elements, {num_kv_heads} KV "
            f"heads, group {group}{where}; pass 1 or None")
    return requested


def _pairs_pay(kv_lens, num_kv_heads: int) -> bool:
    """Whether a batch of ``kv_lens`` is large and even enough for the automatic pairing (PAIR_MIN_TOKEN_HEADS,
    PAIR_MAX_SKEW); True where the lengths are not given."""
    if kv_lens is None:
        return True
    lens = np.asarray(kv_lens, np.float64)
    total = float(lens.sum())
    return (total * num_kv_heads >= PAIR_MIN_TOKEN_HEADS and len(lens) > 0
            and float(lens.max()) <= PAIR_MAX_SKEW * total / len(lens))


def choose_fused_merge(work: np.ndarray, requested: bool | None, *, graph_safe: bool = False) -> bool:
    """Whether the decode kernel merges a plan's split requests itself. ``requested`` True / False decides;
    None fuses for a graph-safe plan (a captured graph then never needs the merge kernel) and where some
    work item (a row of ``work`` [n, 5], partial slot -1) writes its output directly: the merging CTAs'
    tail then overlaps that work. An all-split batch gets the merge kernel, which spreads the merge over
    the GPU (H200: fused 8% slower at B 1, L 64k; 5% faster on 1 x 32k + 63 x 512)."""
    if requested is not None:
        return bool(requested)
    return graph_safe or bool((np.asarray(work)[:, 4] < 0).any())


def workspace_ints(bounds: DecodeBounds, num_kv_heads: int = 0, *, cache=None) -> int:
    """Size (int32 entries) of the device plan buffer for ``bounds``, with the fused merge's counters for
    ``num_kv_heads`` > 0."""
    return plan_layout_ints(bounds.capacity, PackedLayout("bounded", merge_counter_heads=num_kv_heads), cache=cache)


# The tensor-core decode template's tiles, as the launcher picks them, from the decode_tc record
# (attngen/schedules/template_decode_tc.py); the CUDA decode serves 16-bit queries over a 16-bit or an fp8
# cache (``kv_bytes`` 2 or 1: an fp8 cache has its own stage counts and layout).
def decode_tc_element_bytes(kv_bytes: int = 2) -> ElementBytes:
    return ElementBytes(q=2, kv=kv_bytes)


def decode_tc_fits(head_dim: int, smem_optin: int, kv_bytes: int = 2) -> bool:
    """Whether the tensor-core decode template's smallest tile fits a block's shared memory."""
    smallest = DECODE_TC.configs(head_dim, kv_bytes)[-1]
    return DECODE_TC.smem_bytes(smallest, decode_tc_element_bytes(kv_bytes)) <= smem_optin


def decode_tc_ctas_per_sm(head_dim: int, smem_per_sm: int, smem_optin: int, kv_bytes: int = 2) -> int:
    """Resident CTAs per SM of the tensor-core decode template (shared memory bound) for the stage count the
    launcher picks (csrc/decode_launch.cuh): the record's configurations, in the launcher's order."""
    elems = decode_tc_element_bytes(kv_bytes)
    needs = [DECODE_TC.smem_bytes(c, elems) for c in DECODE_TC.configs(head_dim, kv_bytes)]
    return resident_ctas(needs, smem_per_sm, smem_optin)


def decode_tc_stage_order(stages: int) -> list[int]:
    """The stage counts the launcher tries, deepest first."""
    return stage_order(stages)


def resident_ctas(needs: list[int], smem_per_sm: int, smem_optin: int) -> int:
    """CTAs per SM of the first configuration (shared memory bytes, in the launcher's order) that fits a block."""
    for need in needs:
        if need <= smem_optin:
            return max(1, smem_per_sm // (need + 1024))  # 1 KiB per block reserved by the driver
    return 1


def decode_tc_stages(head_dim: int, kv_bytes: int = 2) -> int:
    """The default stage count: the first configuration the launcher tries."""
    return DECODE_TC.configs(head_dim, kv_bytes)[0].stages
