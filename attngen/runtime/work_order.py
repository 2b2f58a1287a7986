"""Work order of the persistent Hopper prefill: which (request, query tile) pairs its CTAs take first.

The kernel (csrc/hopper_prefill.cuh) deals its work items out round by round over the CTAs, rounds in
alternating direction. Dealt longest first over the whole batch, the items of a round shrink together and
every CTA finishes at about the same time (longest processing time first). Without an order the kernel
walks request by request, each request's last query tiles first: right for one causal request, but the
work of a mask-derived tile map follows the documents of a packed row, not the tile index, and a ragged
batch's rounds mix long and short requests unevenly.

An order is a permutation of the pairs ``request * q_tiles + tile`` of the Hopper tiling (each pair's KV
heads are dealt in a row). Its costs are key tiles per pair plus one for the item's query rows and
epilogue: from the mask's bounds on the host (``order_from_bounds``, at the first call of a plan) or from
a tile map's list lengths on the device (``order_from_map``). Any permutation gives the same result, so a
plan that serves later batches within its bounds (CUDA graphs) stays correct with its first batch's order.
"""
from __future__ import annotations

import numpy as np

from attngen.ir.mask_class import bounds_are_the_mask, constant_bounds

from .work_tail import order_on_device, tail_split


def pair_costs(qo_lens: np.ndarray, kv_lens: np.ndarray, *, group: int, q_tiles: int, rows: int, keys: int,
               lower: int | None, upper: int | None) -> np.ndarray:
    """[B, q_tiles] estimated cost of each pair (qo_lens, kv_lens: [B] query rows and keys per request):
    the key tiles its rows may see under the bounds, plus one; 0 for a tile past the request's rows."""
    qo = qo_lens.astype(np.int64)[:, None]
    kv = kv_lens.astype(np.int64)[:, None]
    row0 = np.arange(q_tiles, dtype=np.int64)[None, :] * rows
    rows_total = qo * group
    live = row0 < rows_total
    last_row = np.maximum(np.minimum(row0 + rows, rows_total) - 1, 0)
    base = kv - qo
    hi = np.broadcast_to(kv, live.shape)
    if lower is not None:
        hi = np.minimum(hi, base + last_row // group - lower + 1)
    lo = np.zeros_like(hi)
    if upper is not None:
        lo = np.clip(base + row0 // group - upper, 0, None)
    hi = np.clip(hi, 0, None)
    tiles = np.where(hi > lo, -(-hi // keys) - lo // keys, 0)
    return np.where(live, tiles + 1, 0)


def order_from_costs(costs: np.ndarray) -> np.ndarray:
    """[B * q_tiles] int32: the pairs by descending cost (ties in pair order)."""
    return np.argsort(-costs.reshape(-1), kind="stable").astype(np.int32)


def order_from_bounds(variant, qo_lens: np.ndarray, kv_lens: np.ndarray, *, group: int, q_tiles: int, rows: int,
                      keys: int, device, tail: tuple[int, int] | None = None):
    """The order of a plan's pairs from the mask's constant bounds, as a device int32 tensor. ``tail``: (KV heads,
    head dim) to put the tail split behind the order where one serves (tail_order's conditions), from the same
    costs."""
    lower, upper = constant_bounds(variant)
    costs = pair_costs(qo_lens, kv_lens, group=group, q_tiles=q_tiles, rows=rows, keys=keys, lower=lower,
                       upper=upper)
    order = order_from_costs(costs)
    split = _split_tail(variant, order, costs, *tail, sms=None, device=device) if tail is not None else None
    return order_on_device(order if split is None else split, len(order), tail[1] if tail else 0, device)


def device_sms(device) -> int | None:
    """The SMs of a CUDA device (the persistent kernel's grid, csrc/hopper_launch.cuh); None for another device."""
    import torch

    device = torch.device(device)
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else None


def _split_tail(variant, order: np.ndarray, costs: np.ndarray, heads: int, head_dim: int, *, sms: int | None,
                device) -> np.ndarray | None:
    """work_tail.tail_split of the order where the variant's kernel takes one: its key tiles are the costs'
    count (no mask hook, or one that is its constant bounds: causal, a fixed window) and it has no logits hook
    (measured slower with the split; csrc/hopper_prefill.cuh kTailable); sms: the device's SMs (None: asked of a
    CUDA device; no split on another)."""
    if "logits_transform" in variant.hooks or not bounds_are_the_mask(variant):
        return None
    sms = sms if sms is not None else device_sms(device)
    if sms is None:
        return None
    if "logits_mask" in variant.hooks and len(order) * heads >= sms:  # masked: only items fewer than the SMs
        return None  # (split-KV of appends; the rounds of long causal prefills measured within 1.1% of even)
    return tail_split(order, costs.reshape(-1), heads=heads, sms=sms, head_dim=head_dim)


def tail_order(variant, qo_lens: np.ndarray, kv_lens: np.ndarray, *, group: int, q_tiles: int, rows: int,
               keys: int, heads: int, head_dim: int, device, sms: int | None = None):
    """The order of a plan's pairs with a tail split behind it (runtime/work_tail.py), as a device int32 tensor,
    where the variant's kernel takes one (_split_tail) and the split shortens the launch; else None."""
    lower, upper = constant_bounds(variant)
    costs = pair_costs(qo_lens, kv_lens, group=group, q_tiles=q_tiles, rows=rows, keys=keys, lower=lower,
                       upper=upper)
    out = _split_tail(variant, order_from_costs(costs), costs, heads, head_dim, sms=sms, device=device)
    return None if out is None else order_on_device(out, len(costs.reshape(-1)), head_dim, device)


def order_from_map(indptr, *, batch: int, heads: int, q_tiles: int):
    """The order of a mapped launch's pairs from its tile map (indptr: [batch * heads * q_tiles + 1] device
    int32): by the pair's non-empty key tiles over its head rows (pairs without any, with or without rows,
    last). Stays on the device."""
    import torch

    if batch * q_tiles == 0:
        return torch.zeros(0, dtype=torch.int32, device=indptr.device)
    return order_from_pair_tiles(torch.diff(indptr).view(batch, heads, q_tiles).sum(1).reshape(-1))


def order_from_pair_tiles(tiles):
    """The order of a mapped launch's pairs from their listed key tiles over the head rows (tiles: [batch *
    q_tiles] device int32, csrc/tile_map.cuh tile_lists_kernel): most first, ties in pair order. Stays on the
    device."""
    import torch

    if tiles.numel() == 0:
        return torch.zeros(0, dtype=torch.int32, device=tiles.device)
    return torch.argsort(tiles, descending=True, stable=True).to(torch.int32)
