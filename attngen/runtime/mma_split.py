"""Split-KV of the mma.sync prefill template for launches with few work items (csrc/prefill_split.cuh).

An append of a few query rows over many keys (speculative decoding's verify step: 8 rows over 8k keys) gives the
mma.sync template one CTA per (64-row query tile, KV head, request): 8 CTAs for one request at GQA 32 / 8, each
walking all 128 tiles of 64 keys while the other SMs idle. Where a plan's CTAs are no more than the SMs (two of
this tile's CTAs share an SM, so even two chunks an item stay within one wave), it asks the kernel to cut every
item's key range into ``splits`` chunks of ``chunk_keys`` keys (grid.y), each chunk's state merged in the kernel by
the CTA that finishes its item's last chunk.

The section rides behind the plan's work order entries (which this template does not read) in one int32 tensor;
its header and counters are copied from the host, its partial slots allocated on the device (each chunk writes
its slot before the merge reads it). The launcher derives the split count from the tensor's length, so the layout
here and csrc/prefill_split.cuh must agree: mma_split_count, mma_split_partials_at, mma_split_slot_floats.
"""
from __future__ import annotations

import numpy as np

from attngen.schedules.template_prefill import WIDE_MAX_HEAD_DIM, WIDE_ROWS

MAGIC = 0x5B11
HEADER = 8
ROWS = 64  # the tile's rows where a plan splits (csrc/prefill_launch.cuh: 64-row tiles below 256 packed rows)
THREADS = 128
ORDER_ROWS = 128  # rows of the Hopper template's query tiles, by which the order's entries count (kOrderRows)
MIN_CHUNK_KEYS = 256  # four 64-key tiles: shorter chunks spend more on their slots and merge than they save
CTAS_PER_SM = 2  # the 64-row tile's shared memory lets two CTAs share an SM
MAX_PARTIAL_BYTES = 64 << 20


def slot_floats(head_dim: int) -> int:
    """Floats of one chunk's slot: per thread, head_dim / 8 float4s of accumulators and one of (max, sum)."""
    return THREADS * 4 * (head_dim // 8 + 1)


def partials_at(pairs: int, items: int) -> int:
    """Ints from the section's start to its partials: 16-byte aligned from the tensor's start (``pairs`` before)."""
    at = HEADER + items
    return at + (-(pairs + at)) % 4


def order_pairs(max_qo_len: int, group: int, batch: int) -> int:
    """Entries of the order ahead of the section: one per (request, Hopper query tile), unread by this template."""
    return batch * -(-max_qo_len * group // ORDER_ROWS)


def items_of(max_qo_len: int, group: int, kv_heads: int, batch: int) -> int:
    """CTAs of an unsplit launch of 64-row tiles: (query tile, KV head, request)."""
    return -(-max_qo_len * group // ROWS) * kv_heads * batch


def wide_tiles_possible(head_dim: int, rows_64: bool) -> bool:
    """Whether a launch may take 128-row tiles (which do not split): at head dims up to 128, unless the plan forces
    64-row tiles (``rows_64``)."""
    return head_dim <= WIDE_MAX_HEAD_DIM and not rows_64


def may_split(max_qo_len: int, batch: int, kv_heads: int, sms: int, *, head_dim: int = 128,
              rows_64: bool = False) -> bool:
    """Whether a launch of this batch could split at some GQA group (the fewest rows and CTAs are group 1's): a
    plan reads the batch's key lengths (a device-to-host copy) only then."""
    wide = wide_tiles_possible(head_dim, rows_64)
    return max_qo_len > 0 and (max_qo_len < WIDE_ROWS or not wide) and batch > 0 and kv_heads > 0 and \
        CTAS_PER_SM * sms // items_of(max_qo_len, 1, kv_heads, batch) >= 2


def split_plan(max_qo_len: int, kv_lens: np.ndarray, *, group: int, kv_heads: int, head_dim: int, sms: int,
               rows_64: bool = False):
    """(splits, chunk_keys) for a launch of this batch (kv_lens: [B] keys per request), or None where it has
    enough CTAs, its longest request packs rows for 128-row tiles (head dims up to 128, 64-row tiles not forced:
    ``rows_64``), or no cut of at least MIN_CHUNK_KEYS gives two chunks."""
    rows = max_qo_len * group
    if rows <= 0 or (rows >= WIDE_ROWS and wide_tiles_possible(head_dim, rows_64)) or len(kv_lens) == 0:
        return None
    items = items_of(max_qo_len, group, kv_heads, len(kv_lens))
    want = CTAS_PER_SM * sms // items
    longest = int(np.max(kv_lens))
    if want < 2 or longest < 2 * MIN_CHUNK_KEYS:
        return None
    most = max(2, MAX_PARTIAL_BYTES // (items * slot_floats(head_dim) * 4))  # (the slots' memory)
    # a multiple of every tile's keys, so that the chunks start on the CTAs' tile boundaries
    chunk = -(-max(MIN_CHUNK_KEYS, -(-longest // min(want, most))) // 64) * 64
    splits = -(-longest // chunk)
    return (splits, chunk) if 2 <= splits <= most else None


def split_order(max_qo_len: int, kv_lens: np.ndarray, *, group: int, kv_heads: int, head_dim: int, sms: int,
                pairs: int, device, rows_64: bool = False):
    """The plan's order tensor for an mma.sync launch that splits ([pairs] zeros, then the section; int32, on
    ``device``), or None where split_plan finds no split."""
    import torch

    plan = split_plan(max_qo_len, kv_lens, group=group, kv_heads=kv_heads, head_dim=head_dim, sms=sms,
                      rows_64=rows_64)
    if plan is None:
        return None
    splits, chunk = plan
    items = items_of(max_qo_len, group, kv_heads, len(kv_lens))
    at = partials_at(pairs, items)
    host = np.zeros(pairs + at, dtype=np.int32)  # (the counters zero)
    host[pairs:pairs + HEADER] = [MAGIC, splits, chunk, items, slot_floats(head_dim), HEADER, at, ROWS]
    out = torch.empty(pairs + at + items * splits * slot_floats(head_dim), dtype=torch.int32, device=device)
    out[:len(host)].copy_(torch.from_numpy(host))
    return out
