"""Tail split of the persistent Hopper prefill: the last items of a launch cut into key-tile stretches.

The kernel (csrc/hopper_prefill.cuh) deals its items round by round over min(items, SMs) CTAs (over every SM
where the plan has a tail split). Where the items are many and alike (full attention over equal requests: 2048
items of 47 key tiles over 132 CTAs, 15.52 rounds), the last round leaves most CTAs idle. Where they are fewer
than the SMs (an append of a few query rows over many keys, as speculative decoding's verify step and chunked
prefill run it: 8 items of 64 key tiles for one request of 8 rows over 8k keys), every item is the tail, spread
over every SM (split-KV). ``tail_split`` takes the items of the last pairs in the order out of the rounds (their
order entries become ``pair + pairs``, which the rounds skip) and cuts their key tiles into stretches that bring
every CTA to about the same total (each CTA's rounds' work, estimated as in runtime/work_order.py, plus its
stretch). A stretch inside one item is a piece of it; the pieces of a split item merge in the kernel
(csrc/hopper_tail.cuh), so the result is the unsplit one up to rounding.

The section it returns rides behind the order in one int32 tensor (csrc/hopper_tail.cuh has the layout); its
partial slots are appended on the device (order_on_device).
"""
from __future__ import annotations

import numpy as np

TAIL_HEADER = 12  # csrc/hopper_tile.cuh kTailHeader
TAIL_MAGIC = 0x7A11
TAIL_TO_END = 0x7FFFFFFF
TAIL_COUNTERS = 8  # per slot: one per consumer warp (csrc/hopper_tail.cuh kTailCounters)
TAIL_MAX_PIECES = 8  # pieces a CTA may hold (csrc/hopper_tile.cuh kTailMaxPieces: its shared-memory list)
MIN_STRETCH = 4  # key tiles below which a CTA's stretch is not worth a piece's prologue and merge
MIN_GAIN = 0.01  # the estimated makespan must shrink by this share of it
# items fewer than the SMs cut where the CTAs' loads meet (_fill) read their head's keys at different times, not
# as one stream through L2: 128 items of 257 key tiles (a chunk of 512 rows over 32k keys, H100) ran 711 us so
# cut against 588 us in rounds, where the estimate was 3% faster; such a cut is made where it gains this share
FILL_MIN_GAIN = 0.25
# key tiles' worth a split item's last piece spends per slot it merges (csrc/hopper_tail.cuh): 0 to 0.5 gave the
# same times within 1.5% on five verify steps (H100); 1 and 2 picked fewer, longer pieces, 16% and 37% slower on one
# request of 8 rows over 8k keys
MERGE_COST = 0.25


def snake_ctas(items: int, ctas: int) -> np.ndarray:
    """[items] the CTA that deals item idx (rounds of ``ctas`` items in alternating direction)."""
    idx = np.arange(items)
    rnd, i = np.divmod(idx, ctas)
    return np.where(rnd % 2 == 0, i, ctas - 1 - i)


def partial_ints(head_dim: int) -> int:
    """Ints (float32 each) of one partial slot: 2 consumers x (D / 8 + 1) float4 chunks x 128 threads."""
    return 2 * (head_dim // 8 + 1) * 128 * 4


def tail_split(order: np.ndarray, pair_cost: np.ndarray, *, heads: int, sms: int, head_dim: int):
    """The order with its tail's pairs shifted and the tail section behind it ([len] int32, host), or None where
    a split would not shorten the launch by MIN_GAIN. order: [pairs] the pairs in dealing order; pair_cost:
    [pairs] each pair's key tiles plus one (0: no rows), per KV head; heads: KV heads (items per pair)."""
    pairs = len(order)
    items = pairs * heads
    ctas = sms if items else 0  # (a launch with a tail split runs one CTA per SM: csrc/hopper_launch.cuh)
    cost = np.repeat(pair_cost[order], heads).astype(np.int64)  # [items] in dealing order
    # pairs without rows come last in the order (the rounds skip them at once) and stay there: a later batch
    # replayed under the plan's bounds may give them rows
    live_pairs = int((pair_cost[order] > 0).sum())
    live = live_pairs * heads
    if ctas == 0 or live % ctas == 0:
        return None
    min_gain = MIN_GAIN
    if live < ctas:  # every live item is the tail: split-KV in even chunks where they fit the CTAs
        pieces = _chunk_pieces(cost[:live] - 1, ctas)
        if pieces is not None:
            return _split_order(order, 0, live_pairs, pieces, ctas, heads, head_dim, spread=True)
        min_gain = FILL_MIN_GAIN  # (else the stretches below, only where they gain much)
    owner = snake_ctas(items, ctas)
    before = np.bincount(owner, weights=cost, minlength=ctas).max()
    # the pairs whose items reach into the last, part-filled round of live items leave the rounds
    first_pair = (live // ctas) * ctas // heads
    tail = np.arange(first_pair * heads, live)
    kept = np.ones(items, dtype=bool)
    kept[first_pair * heads:live] = False
    load = np.bincount(owner[kept], weights=cost[kept], minlength=ctas).astype(np.float64)
    tiles = cost[tail] - 1  # key tiles per tail item
    stretches = _fill(load, int(tiles.sum()))
    after = (load + stretches + (stretches > 0)).max()
    if after > before * (1 - min_gain):
        return None
    pieces = np.array(_pieces(tail, tiles, stretches), dtype=np.int64).reshape(-1, 5)
    if np.bincount(pieces[:, 0], minlength=ctas).max(initial=0) > TAIL_MAX_PIECES:
        return None  # (a stretch over many short items: more pieces than a CTA's list holds)
    return _split_order(order, first_pair, live_pairs, pieces, ctas, heads, head_dim)


def _split_order(order: np.ndarray, first_pair: int, live_pairs: int, pieces: np.ndarray, ctas: int, heads: int,
                 head_dim: int, spread: bool = False) -> np.ndarray:
    """[len] int32: the order with its taken pairs first_pair .. live_pairs - 1 shifted past the pairs' range (the
    rounds skip them), then the section of ``pieces``, each naming its item as pair * heads + KV head (the kernel
    then reads no order entry to find a piece's pair) rather than by its dealing index. spread: every CTA runs at
    most one piece and no rounds (the chunked cut of items fewer than the SMs), so that the pieces of an item may
    wait on each other and merge side by side (csrc/hopper_tail.cuh)."""
    pairs = len(order)
    shifted = order.astype(np.int64).copy()
    shifted[first_pair:live_pairs] += pairs
    pieces = pieces.copy()
    pieces[:, 1] = order[pieces[:, 1] // heads].astype(np.int64) * heads + pieces[:, 1] % heads
    section = _section(pieces, ctas, first_pair * heads, head_dim, pairs, spread)
    return np.concatenate([shifted, section]).astype(np.int32)


def _chunk_pieces(tiles: np.ndarray, ctas: int) -> np.ndarray | None:
    """The pieces ([pieces, 5]: cta, item, first tile, end tile, slot; one a CTA) of items fewer than the CTAs,
    each cut at the same multiples of one chunk of key tiles (the items of a KV head then stream the same keys at
    once, as the unsplit ones do: L2 serves them; a cut where the CTAs' loads meet, as _fill's, measured 20%
    slower on 128 items of 257 key tiles). The chunk: the least estimated time, chunk + 1 + MERGE_COST per slot
    of the most-cut item, among those whose pieces fit the CTAs; None where that is not MIN_GAIN below the
    longest item's. tiles: [items] key tiles per item (-1: no rows), in dealing order."""
    top = int(tiles.max(initial=0))
    if top < 2 * MIN_STRETCH:
        return None
    cuts = np.arange(2, min(ctas, top // MIN_STRETCH) + 1)
    chunks = np.unique(-(-top // cuts))  # (the chunks that cut the longest item into `cuts` pieces)
    counts = np.maximum(-(-np.maximum(tiles, 0)[:, None] // chunks[None, :]), 1)  # [items, chunks] pieces
    fits = counts.sum(axis=0) <= ctas
    if not fits.any():
        return None
    most = counts.max(axis=0)
    est = np.where(fits, chunks + 1 + MERGE_COST * most, np.inf)
    k = int(np.argmin(est))
    if est[k] > (top + 1) * (1 - MIN_GAIN):
        return None
    chunk, n = int(chunks[k]), counts[:, k]  # (vectorised: a verify step's plan runs it)
    total = int(n.sum())
    j = np.arange(total) - np.repeat(np.cumsum(n) - n, n)  # [pieces] the piece's index in its item
    last = j == np.repeat(n, n) - 1
    split = np.repeat(n > 1, n)
    return np.stack([np.arange(total), np.repeat(np.arange(len(n)), n), j * chunk,
                     np.where(last, TAIL_TO_END, (j + 1) * chunk), np.where(split, np.cumsum(split) - 1, -1)], 1)


def _fill(load: np.ndarray, total: int) -> np.ndarray:
    """[ctas] key tiles each CTA takes of the tail's ``total``: the least loaded first, up to the lowest whole
    level whose rooms hold the tail (a CTA's room: level - load - 1, each piece costing one tile's worth besides
    its keys; none below MIN_STRETCH), the last taker the remainder. Found by bisection over whole levels (a
    plan per verify step runs it: the tile-at-a-time fill it replaces took 2 ms on one request of 8k keys)."""

    def rooms(level: int) -> np.ndarray:
        room = np.clip(level - 1 - np.ceil(load).astype(np.int64), 0, None)
        room[room < MIN_STRETCH] = 0
        return room

    lo, hi = int(np.floor(load.min())), int(np.ceil(load.max())) + total + MIN_STRETCH + 1
    while lo < hi:  # (rooms grow with the level: the least level that holds the tail)
        mid = (lo + hi) // 2
        if rooms(mid).sum() >= total:
            hi = mid
        else:
            lo = mid + 1
    room = rooms(lo)
    take = np.zeros(len(load), dtype=np.int64)
    left = total
    for c in np.argsort(load, kind="stable"):
        if left == 0:
            break
        take[c] = min(int(room[c]), left)
        left -= int(take[c])
    return take


def _pieces(tail: np.ndarray, tiles: np.ndarray, take: np.ndarray) -> list[list[int]]:
    """[cta, item, first tile, end tile, slot]: the tail items' tiles as one stream, cut into the CTAs'
    stretches in CTA order; slots numbered per split item (consecutive), -1 for whole items."""
    pieces = []
    item_i, offset = 0, 0  # the stream's position: item tail[item_i], its tile offset
    for c in range(len(take)):
        need = int(take[c])
        while need > 0 and item_i < len(tail):
            n = min(need, int(tiles[item_i]) - offset)  # (0 for an item of no tiles: a whole piece here)
            pieces.append([c, int(tail[item_i]), offset, offset + n, 0])
            need -= n
            offset += n
            if offset >= tiles[item_i]:
                item_i, offset = item_i + 1, 0
    last = int(np.flatnonzero(take)[-1]) if take.any() else 0
    for k in range(item_i, len(tail)):  # (items of no tiles past the stream's end: whole, on the last taker)
        pieces.append([last, int(tail[k]), 0, 0, 0])
    by_item: dict[int, list[list[int]]] = {}
    for p in pieces:
        by_item.setdefault(p[1], []).append(p)
    slot = 0
    for item, group in by_item.items():
        if len(group) == 1:
            group[0][2], group[0][3], group[0][4] = 0, TAIL_TO_END, -1
            continue
        group.sort(key=lambda p: p[2])
        group[-1][3] = TAIL_TO_END  # (the last piece runs to the item's end, whatever its length then)
        for p in group:
            p[4] = slot
            slot += 1
    return sorted(pieces, key=lambda p: p[0])  # (stable: each CTA's pieces in stream order)


def order_on_device(order: np.ndarray, pairs: int, head_dim: int, device):
    """A plan's order ([pairs] int32, host, a tail section behind it where there is one) as the device tensor the
    kernel reads: with a section, its partial slots appended uninitialised (each piece writes its slot before
    the merge reads it), so that a plan copies the few header, piece and counter ints, not megabytes of zeros."""
    import torch

    if len(order) == pairs:
        return torch.from_numpy(order).to(device)
    slots = int(order[pairs + 4])
    out = torch.empty(len(order) + slots * partial_ints(head_dim), dtype=torch.int32, device=device)
    out[:len(order)].copy_(torch.from_numpy(order))
    return out


def piece_offset(pairs: int, ctas: int) -> int:
    """Where piece_at starts in the section behind ``pairs`` order ints for ``ctas`` CTAs (ints from the section's
    start): cta_ptr right behind the header, piece_at past it on the next 16-byte boundary of the order. The kernel
    computes it too (csrc/hopper_tail.cuh hopper_tail_piece_offset), to load a CTA's piece with the header."""
    at = TAIL_HEADER + ctas + 1
    return at + (-(pairs + at)) % 4


def _section(pieces: np.ndarray, ctas: int, split_from: int, head_dim: int, pairs: int,
             spread: bool = False) -> np.ndarray:
    """The int32 section behind the order (csrc/hopper_tail.cuh) for ``pieces`` ([pieces, 5]: cta, item as
    _split_order names it, first tile, end tile, slot; in CTA order), up to its partial slots, which
    order_on_device appends on the device; its arrays aligned for their vector reads (offsets counted from the
    order's start, which the allocation aligns to 256 bytes). spread: the header's last word (_split_order)."""
    slots = int(pieces[:, 4].max(initial=-1)) + 1
    if spread and (split_from or np.bincount(pieces[:, 0], minlength=ctas).max(initial=0) > 1):
        raise ValueError("a spread tail runs no rounds and at most one piece a CTA")

    def align(at: int, ints: int) -> int:
        return at + (-(pairs + at)) % ints

    off_cta = TAIL_HEADER
    off_piece = piece_offset(pairs, ctas)
    # (piece_at padded to one piece a CTA, -1s past the pieces: each CTA loads piece blockIdx.x with the header
    # before it knows the count, and that load must read ints the plan wrote, not the uninitialised slots)
    off_split = align(off_piece + 4 * max(len(pieces), ctas), 2)
    off_count = off_split + 2 * slots
    off_part = align(off_count + TAIL_COUNTERS * slots, 4)
    out = np.zeros(off_part, dtype=np.int64)  # (the partial slots follow on the device: order_on_device)
    out[:TAIL_HEADER] = [TAIL_MAGIC, split_from, ctas, len(pieces), slots, off_cta, off_piece, off_split,
                         off_count, off_part, head_dim, int(spread)]
    out[off_cta:off_cta + ctas + 1] = np.concatenate([[0], np.cumsum(np.bincount(pieces[:, 0], minlength=ctas))])
    out[off_piece:off_split] = -1
    out[off_piece:off_piece + 4 * len(pieces)] = pieces[:, 1:].reshape(-1)
    split = pieces[pieces[:, 4] >= 0]  # each split piece's slot: its item's first slot and slot count
    items, at = np.unique(split[:, 1], return_inverse=True)
    first = np.full(len(items), slots, dtype=np.int64)
    np.minimum.at(first, at, split[:, 4])
    pairs_at = np.zeros((slots, 2), dtype=np.int64)
    pairs_at[split[:, 4]] = np.stack([first[at], np.bincount(at)[at]], 1)
    out[off_split:off_split + 2 * slots] = pairs_at.reshape(-1)
    return out
