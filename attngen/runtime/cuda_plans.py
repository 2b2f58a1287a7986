"""The CUDA module's plans: what ``plan_decode`` and ``plan_prefill`` decide once per batch and every layer's
call reuses (the decode split and its workspace, the prefill template, tile rows, tile maps and work orders)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attngen.schedules.ffi_enums import DecodeBackend, PrefillTemplate, PrefillTileRows

from .checks import AttentionArgumentError
from .cuda_stream import stream_capturing
from .replay_guard import check_replay_batch
from .tile_map import KVBound, TileMap
from .mma_split import order_pairs, split_order
from .work_order import device_sms, order_from_bounds


@dataclass(frozen=True)
class DecodeLaunch:
    """How one decode call splits its keys: the arguments the decode entry function takes after
    ``sm_scale``, in its order (csrc/entry_decode.h, ``DecodeSplitArgs``)."""

    part_o: object  # [B, C, Hq, D] float32 partial outputs (plan mode: [slots, Hq, D]); unused for one chunk
    part_lse: object  # [B, C, Hq] float32 (plan mode: [slots, Hq])
    num_chunks: int = 1  # even split: chunks per request (ignored with a plan)
    backend: DecodeBackend = DecodeBackend.AUTO
    device_plan: object = None  # plan mode: the split-KV plan's int32 buffer on the device (decode_plan.py)
    plan_ctas: int = 0  # plan mode: CTAs per grid row (a KV head, or a pair of them)
    plan_merges: int = 0  # plan mode: merge blocks launched (the split requests, or the bound if graph-safe)
    kv_heads_per_cta: int = 1  # 2: a tensor-core CTA serves two KV heads (decode_plan.kv_heads_per_cta)

    def ffi_args(self) -> tuple:
        return (self.part_o, self.part_lse, self.num_chunks, self.backend, self.device_plan, self.plan_ctas,
                self.plan_merges, self.kv_heads_per_cta)


@dataclass
class DecodePlan:
    batch_size: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    launch: DecodeLaunch
    work: object = None  # plan mode: the DecodeWorkspace holding the device work list
    generation: int = 0  # plan mode: which fill of the workspace this plan is
    split: object = None  # plan mode: the host SplitKVPlan (for inspection)
    fused_merge: bool = False  # plan mode: the decode kernel merges the split requests (no merge kernel)
    max_kv_len: int | None = None  # the planned batch's longest KV length (checks reads that follow positions)

    @property
    def num_chunks(self) -> int:
        return self.launch.num_chunks

    @property
    def backend(self) -> DecodeBackend:
        return self.launch.backend

    @property
    def part_o(self):
        return self.launch.part_o

    @property
    def part_lse(self):
        return self.launch.part_lse

    @property
    def num_merges(self) -> int:
        return self.launch.plan_merges

    @property
    def kv_heads_per_cta(self) -> int:
        return self.launch.kv_heads_per_cta


MAX_GRID_BATCH = 65535  # the request index is a grid dimension


@dataclass
class PrefillPlan:
    batch_size: int
    total_q: int
    max_qo_len: int  # sizes the grid: query tiles per request
    qo_indptr_key: tuple  # which qo_indptr (object and version) the plan was made from
    # AUTO: the library's choice; ROWS_128: the wide tile for long requests (D <= 128); ROWS_64: the 64-row tiles
    tile_rows: PrefillTileRows = PrefillTileRows.AUTO
    # AUTO: the library's choice (csrc/prefill_dispatch.h); MMA_SYNC / HOPPER force a template
    kernel: PrefillTemplate = PrefillTemplate.AUTO
    # whether calls walk a tile map derived from the mask (runtime/tile_map.py), decided when planning
    tile_map: bool = False
    # the maps derived so far, by the mask's tensor parameters they were made from (made on first use)
    maps: dict = field(default_factory=dict, repr=False, compare=False)
    # the batch's [B] query rows and keys per request (host), where calls deal the Hopper template's work
    # longest first (runtime/work_order.py); None: request by request
    lengths: tuple | None = field(default=None, repr=False, compare=False)
    # the work orders made so far, by (GQA group, head_dim, device) (made on first use)
    orders: dict = field(default_factory=dict, repr=False, compare=False)
    # the row-hook pass (runtime/hook_pass.py): None the library's choice, True / False as asked
    hook_pass: bool | None = None
    # the Hopper template's tail split (runtime/work_tail.py): None where it shortens the launch, False never
    tail_split: bool | None = None
    # whether the library holds its masked kernels' Split instances, which split their appends (whole-program
    # builds; csrc/hopper_launch.cuh hopper_split_instance)
    masked_split: bool = False
    # [B] keys per request (host), where calls run the mma.sync template and may split its keys (runtime/mma_split.py)
    mma_kv_lens: np.ndarray | None = field(default=None, repr=False, compare=False)
    # where calls may walk a tile map: the planned batch's longest KV length and its index arrays
    # (runtime/tile_map.py KVBound), so that a call with those arrays sizes its map without reading the device
    kv_bound: KVBound | None = field(default=None, repr=False, compare=False)
    # whether max_qo_len was given (a plan for CUDA-graph replays of other batches: runtime/replay_guard.py)
    replay_bound: bool = False
    # the guard's row indices 0 .. total_q - 1 by device (made on the first call: replay_rows)
    _replay_rows: dict = field(default_factory=dict, repr=False, compare=False)

    def replay_rows(self, device):
        """int32 [total_q] 0, 1, ... on ``device``, made once (poison_rows_over_bound's row indices)."""
        key = str(device)
        if key not in self._replay_rows:
            import torch

            self._replay_rows[key] = torch.arange(self.total_q, dtype=torch.int32, device=device)
        return self._replay_rows[key]

    @property
    def guards_replays(self) -> bool:
        """Whether calls set the rows of a request longer than the bound to NaN (a replayed batch may hold one)."""
        return self.replay_bound and self.max_qo_len < self.total_q

    def check_replay(self, qo_indptr) -> None:
        """Refuse, naming the bound, a batch (qo_indptr [B+1]) that a graph captured with this plan cannot
        replay: another batch size or total of query rows, or a request longer than ``max_qo_len``; and any
        batch where the plan walks a tile map (a map classifies one batch's tiles)."""
        if self.tile_map:
            raise AttentionArgumentError("plan: walks a tile map made for one batch, which a replay over another "
                                         "batch would misread: capture with plan_prefill(..., tile_map=False)")
        check_replay_batch(qo_indptr, batch_size=self.batch_size, total_q=self.total_q, max_qo_len=self.max_qo_len)

    def max_kv_len(self, kv) -> int | None:
        """The planned batch's longest KV length for a view with the planned index arrays (KVBound), else None."""
        return self.kv_bound.max_len(kv) if self.kv_bound is not None else None

    def ffi_args(self, tile_map: TileMap | None = None, order=None, hook_workspace=None) -> tuple:
        """What the prefill entry functions take after ``sm_scale`` (csrc/entry_prefill.h)."""
        tiles = tile_map.ffi_args() if tile_map is not None else (None, None, 0)
        return (self.max_qo_len, self.tile_rows, self.kernel, *tiles, order, hook_workspace)

    def work_order(self, variant, group: int, head_dim: int, device, tile_map: TileMap | None = None,
                   kv_scaled: bool = False, kv_heads: int = 1):
        """The order the Hopper template deals this plan's work in (a tile map's own, else from the mask's
        bounds and the kernel's key tiles, made on the first call of each GQA group, head dim, cache kind and
        device), or None, with the tail split behind it where one serves (runtime/work_tail.py). ``kv_scaled``:
        an fp8 cache; ``kv_heads``: the call's KV heads."""
        if self.lengths is None:  # not asked for, or no Hopper template in the library or on the plan's GPU
            return None
        if tile_map is not None:
            return tile_map.order
        key = (group, head_dim, kv_scaled, kv_heads, str(device))
        if key not in self.orders:
            if stream_capturing(device):  # no host-to-device copy inside a CUDA graph capture: the kernel's own order
                return None
            from attngen.schedules.template_prefill_hopper import hopper_config_for

            tile = hopper_config_for(variant, head_dim, kv_scaled)
            # (the kernel's tail takes no fp8 stages; a masked variant's only in its Split instance)
            splits = self.tail_split is not False and not kv_scaled and (self.masked_split or "logits_mask" not in
                                                                         variant.hooks)
            tail = (kv_heads, head_dim) if splits else None
            self.orders[key] = order_from_bounds(variant, *self.lengths, group=group,
                                                 q_tiles=-(-self.max_qo_len * group // tile.rows), rows=tile.rows,
                                                 keys=tile.keys, device=device, tail=tail)
        return self.orders[key]


    def mma_split_order(self, group: int, head_dim: int, kv_heads: int, device, sms: int | None = None):
        """The order tensor whose section splits the mma.sync template's keys (runtime/mma_split.py) for this
        plan's batch, made on the first call of each GQA group, head dim, KV heads and device; None where the plan
        runs the Hopper template, asked for no split, or its launch has CTAs enough. ``sms``: the device's (None:
        asked of a CUDA device; no split on another)."""
        if self.mma_kv_lens is None or self.tail_split is False or self.tile_map:
            return None
        key = ("mma", group, head_dim, kv_heads, str(device))
        if key not in self.orders:
            sms = sms if sms is not None else device_sms(device)
            if sms is None or stream_capturing(device):  # (no host-to-device copy inside a capture: unsplit)
                return None
            pairs = order_pairs(self.max_qo_len, group, self.batch_size)
            self.orders[key] = split_order(self.max_qo_len, self.mma_kv_lens, group=group, kv_heads=kv_heads,
                                           head_dim=head_dim, sms=sms, pairs=pairs, device=device,
                                           rows_64=self.tile_rows == PrefillTileRows.ROWS_64)
        return self.orders[key]
