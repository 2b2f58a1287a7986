"""The Hopper template's tail split (runtime/work_tail.py): its pieces cover every key tile of the items it takes
out of the rounds exactly once, its section matches what the kernel reads (csrc/hopper_tail.cuh), it shortens
the estimated launch, and plans carry it only where the kernel takes one."""
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from attngen.runtime import work_order, work_tail
from attngen.runtime.work_order import order_from_costs, pair_costs, tail_order
from attngen.runtime.work_tail import TAIL_HEADER, TAIL_TO_END, partial_ints, snake_ctas, tail_split
from attngen.variants import builtin

from .conftest import requires_nvcc

CSRC = Path(__file__).resolve().parent.parent / "attngen" / "csrc"


def section(out, pairs, heads=None):
    """The header and arrays of a tail section behind ``pairs`` order entries; with ``heads``, the pieces' items
    (named pair * heads + KV head) as their dealing indices, each a taken pair's (shifted past the pairs' range in
    the order)."""
    s = out[pairs:]
    h = s[:TAIL_HEADER]
    ctas, pieces, slots = int(h[2]), int(h[3]), int(h[4])
    sec = dict(header=h, cta_ptr=s[h[5]:h[5] + ctas + 1], pieces=s[h[6]:h[6] + 4 * pieces].reshape(-1, 4).copy(),
               split_at=s[h[7]:h[7] + 2 * slots].reshape(-1, 2), counters=s[h[8]:h[8] + 8 * slots],
               offsets=[int(x) for x in h[5:10]], length=len(s), slots=slots, ctas=ctas)
    if heads is not None:
        at = {int(v) - pairs: i for i, v in enumerate(out[:pairs]) if v >= pairs}  # taken pair -> order position
        named = sec["pieces"][:, 0]
        assert ((0 <= named) & (named < pairs * heads)).all()
        sec["pieces"][:, 0] = [at[int(n) // heads] * heads + int(n) % heads for n in named]
    return sec


CASES = [  # (query rows per request, keys, GQA group, KV heads, key tiles, head dim, SMs)
    ([8192], [8192], 4, 8, 176, 128, 132),  # full attention L 8k: 2048 items, 15.52 rounds
    ([8192], [8192], 1, 16, 192, 64, 132),
    ([3000, 3000, 3000], [3000, 3100, 2900], 4, 8, 176, 128, 132),
    ([1000, 0, 1100], [1000, 5, 1200], 4, 4, 64, 256, 132),  # (a request without rows: its pairs are empty)
    ([700, 300], [2000, 300], 2, 3, 176, 128, 7),
    ([8], [8192], 4, 8, 128, 128, 132),  # a verify step: 8 items of 64 key tiles, fewer than the SMs
    ([8, 16, 3], [4096, 8192, 300], 4, 8, 128, 128, 132),
]


@pytest.mark.parametrize("qo,kv,group,heads,keys,head_dim,sms", CASES)
def test_pieces_cover_the_taken_items_once(qo, kv, group, heads, keys, head_dim, sms):
    qo, kv = np.array(qo), np.array(kv)
    q_tiles = -(-int(qo.max()) * group // 128)
    costs = pair_costs(qo, kv, group=group, q_tiles=q_tiles, rows=128, keys=keys, lower=None, upper=None)
    order = order_from_costs(costs)
    pairs, items = len(order), len(order) * heads
    out = tail_split(order, costs.reshape(-1), heads=heads, sms=sms, head_dim=head_dim)
    assert out is not None and out.dtype == np.int32
    sec = section(out, pairs, heads)
    h = sec["header"]
    ctas = sms  # (a launch with a tail runs a CTA per SM, whatever its items)
    first = int(h[1])
    live = int((costs > 0).sum()) * heads
    assert h[0] == 0x7A11 and h[2] == ctas and h[10] == head_dim and first == (live // ctas) * ctas // heads * heads
    # the order: the taken pairs shifted past the pairs' range, the rest as they were
    shifted = out[:pairs]
    np.testing.assert_array_equal(shifted[:first // heads], order[:first // heads])
    np.testing.assert_array_equal(shifted[first // heads:live // heads], order[first // heads:live // heads] + pairs)
    np.testing.assert_array_equal(shifted[live // heads:], order[live // heads:])  # (pairs without rows stay)
    # alignment of the vector reads (from the order's start) and the section's length
    assert (pairs + sec["offsets"][1]) % 4 == 0 and (pairs + sec["offsets"][2]) % 2 == 0
    # the layout the kernel assumes to load a CTA's cta_ptr entries and piece with the header (hopper_tail.cuh)
    assert sec["offsets"][0] == TAIL_HEADER and sec["offsets"][1] == work_tail.piece_offset(pairs, ctas)
    # (a piece's room for each CTA: the kernel loads piece blockIdx.x before it knows the count; those ints written)
    assert sec["offsets"][2] >= sec["offsets"][1] + 4 * ctas
    assert sec["offsets"][3] == sec["offsets"][2] + 2 * sec["slots"]  # (counters right behind split_at: the same)
    assert (pairs + sec["offsets"][4]) % 4 == 0
    assert sec["length"] == sec["offsets"][4]  # (the partial slots are appended on the device: order_on_device)
    assert not sec["counters"].any()  # zero before the first launch
    cta_ptr = sec["cta_ptr"]
    assert cta_ptr[0] == 0 and cta_ptr[-1] == len(sec["pieces"]) and (np.diff(cta_ptr) >= 0).all()
    tiles = np.repeat(costs.reshape(-1)[order], heads) - 1  # per item in dealing order (-1: no rows)
    by_item = {}
    assert (np.diff(cta_ptr) <= work_tail.TAIL_MAX_PIECES).all()  # (the kernel's list of a CTA's pieces)
    # spread (side-by-side merges that wait on the item's other pieces): only without rounds, one piece a CTA
    assert h[11] in (0, 1)
    if h[11]:
        assert first == 0 and (np.diff(cta_ptr) <= 1).all()
    for c in range(ctas):
        seen = set()
        for item, lo, hi, slot in sec["pieces"][cta_ptr[c]:cta_ptr[c + 1]]:
            assert item not in seen  # (a CTA holds one stretch: one piece of an item at most)
            seen.add(item)
            by_item.setdefault(int(item), []).append((int(lo), int(hi), int(slot)))
    assert sorted(by_item) == list(range(first, live))  # every taken item, and no other
    for item, ps in by_item.items():
        n = max(int(tiles[item]), 0)
        if len(ps) == 1:
            assert ps == [(0, TAIL_TO_END, -1)]
            continue
        ps.sort()
        slots = [p[2] for p in ps]
        assert slots == list(range(slots[0], slots[0] + len(ps)))  # consecutive slots
        assert ps[0][0] == 0 and ps[-1][1] == TAIL_TO_END and all(a[1] == b[0] for a, b in zip(ps, ps[1:]))
        assert ps[-1][0] < n  # (every piece holds a tile)
        for s in slots:
            assert tuple(sec["split_at"][s]) == (slots[0], len(ps))
    # the estimate: each CTA's rounds, then its pieces (their tiles and one for each piece)
    cost = tiles + 1
    owner = snake_ctas(items, ctas)
    before = np.bincount(owner, weights=cost, minlength=ctas).max()
    kept = np.ones(items, dtype=bool)
    kept[first:live] = False
    load = np.bincount(owner[kept], weights=cost[kept], minlength=ctas)
    for c in range(ctas):
        for item, lo, hi, _ in sec["pieces"][cta_ptr[c]:cta_ptr[c + 1]]:
            load[c] += (max(int(tiles[item]), 0) if hi == TAIL_TO_END else hi) - lo + 1
    assert load.max() <= before * (1 - work_tail.MIN_GAIN)


def test_no_split_where_the_rounds_are_full_or_nothing_is_gained():
    qo = np.array([128 * 33])
    costs = pair_costs(qo, qo, group=1, q_tiles=33, rows=128, keys=176, lower=None, upper=None)
    assert tail_split(order_from_costs(costs), costs.reshape(-1), heads=4, sms=132, head_dim=128) is None  # 132 items
    few = pair_costs(np.array([100]), np.array([100]), group=1, q_tiles=1, rows=128, keys=176, lower=None, upper=None)
    assert tail_split(order_from_costs(few), few.reshape(-1), heads=8, sms=132, head_dim=128) is None  # one round


def test_plans_carry_a_tail_only_where_the_kernel_takes_one(monkeypatch):
    """Maskless variants over 16-bit caches on a CUDA device; not with a mask or logits hook, an fp8 cache,
    tail_split=False, or a device without SMs to deal to."""
    from attngen.runtime.cuda import PrefillPlan

    lengths = (np.array([8192]), np.array([8192]))
    vanilla, causal = builtin("vanilla"), builtin("causal")
    assert PrefillPlan(1, 8192, 8192, (), lengths=lengths).work_order(vanilla, 4, 128, "cpu", kv_heads=8).numel() == 256
    monkeypatch.setattr(work_order, "device_sms", lambda device: 132)
    plan = PrefillPlan(1, 8192, 8192, (), lengths=lengths)
    with_tail = plan.work_order(vanilla, 4, 128, "cpu", kv_heads=8)
    assert with_tail.numel() > 256 and with_tail[256].item() == 0x7A11
    assert plan.work_order(vanilla, 4, 128, "cpu", kv_heads=8) is with_tail  # made once
    assert plan.work_order(vanilla, 4, 128, "cpu", kv_heads=8, kv_scaled=True).numel() == 256
    # (a plan serves one library: a fresh one for the causal variant)
    assert PrefillPlan(1, 8192, 8192, (), lengths=lengths).work_order(causal, 4, 128, "cpu", kv_heads=8).numel() == 256
    off = PrefillPlan(1, 8192, 8192, (), lengths=lengths, tail_split=False)
    assert off.work_order(vanilla, 4, 128, "cpu", kv_heads=8).numel() == 256
    for name in ("causal", "logits_softcap"):
        assert tail_order(builtin(name), *lengths, group=4, q_tiles=256, rows=128, keys=128, heads=8, head_dim=128,
                          device="cpu", sms=132) is None, name
    assert tail_order(vanilla, *lengths, group=4, q_tiles=256, rows=128, keys=128, heads=8, head_dim=128,
                      device="cpu", sms=132) is not None


def test_constants_match_the_kernel():
    tile = (CSRC / "hopper_tile.cuh").read_text()
    tail = (CSRC / "hopper_tail.cuh").read_text()
    consts = dict(re.findall(r"(kTail\w+) = (0x[0-9A-Fa-f]+|\d+)", tile + tail))
    assert int(consts["kTailHeader"], 0) == TAIL_HEADER and int(consts["kTailMagic"], 0) == work_tail.TAIL_MAGIC
    assert int(consts["kTailToEnd"], 0) == TAIL_TO_END and int(consts["kTailCounters"], 0) == work_tail.TAIL_COUNTERS
    assert int(consts["kTailMaxPieces"], 0) == work_tail.TAIL_MAX_PIECES
    assert "constexpr int kTailChunks = D / 8 + 1;" in tail and partial_ints(128) == 2 * 17 * 128 * 4


@requires_nvcc
def test_the_kernels_piece_offset_is_the_plans(tmp_path):
    """hopper_tail_piece_offset (compiled for the host from csrc/hopper_tail.cuh) against work_tail.piece_offset
    on every residue of the order's length and a range of grids: the kernel traps on a section whose piece_at
    is anywhere else."""
    src = tmp_path / "offset.cu"
    src.write_text('#include <cstdio>\n#include "hopper_tail.cuh"\nint main() {\n'
                   '  for (int p = 1; p < 9; ++p) for (int c = 1; c < 140; c += 7)\n'
                   '    printf("%d %d %d\\n", p, c, attngen::hopper_tail_piece_offset(p, c));\n}\n')
    exe = tmp_path / "offset"
    subprocess.run(["nvcc", "-std=c++17", f"-I{CSRC}", "-o", str(exe), str(src)], check=True, capture_output=True)
    rows = [tuple(map(int, line.split())) for line in subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True).stdout.split("\n") if line]
    assert len(rows) == 8 * 20
    for pairs, ctas, at in rows:
        assert at == work_tail.piece_offset(pairs, ctas), (pairs, ctas)


def test_appends_split_where_items_are_fewer_than_the_sms():
    """A verify step's or a chunk's items (few query rows over many keys) are fewer than the SMs: every item is
    cut over the SMs for variants without a mask and for those whose mask is its constant bounds (causal), not for
    a window of a parameter's size, a mask beyond bounds, or a logits hook; masked variants keep their rounds
    where the items fill the SMs."""
    lengths = (np.array([8, 16, 3]), np.array([8192, 4096, 700]))
    args = dict(group=4, q_tiles=1, rows=128, keys=128, heads=8, head_dim=128, device="cpu", sms=132)
    for name, splits in [("vanilla", True), ("causal", True), ("attention_sink", True),
                         ("sliding_window_causal", False), ("custom_mask", False), ("logits_softcap", False),
                         ("alibi", False)]:
        out = tail_order(builtin(name), *lengths, **args)
        assert (out is not None) == splits, name
        if splits:
            sec = section(out.numpy(), 3)
            assert sec["ctas"] == 132 and int(sec["header"][1]) == 0  # (every item taken out of the rounds)
            assert np.count_nonzero(np.diff(sec["cta_ptr"])) > 100  # (spread over the SMs, not on 24 items' own)
    many = (np.array([8] * 40), np.array([8192] * 40))  # 320 items: the causal rounds as they were
    assert tail_order(builtin("causal"), *many, **args) is None


def test_no_split_where_a_cta_would_hold_more_pieces_than_its_list():
    """A last round of one long item and many short ones: the stretches of the short ones would put more than
    TAIL_MAX_PIECES pieces on a CTA, so the plan keeps the rounds. (Items fewer than the SMs are cut in chunks,
    one piece a CTA: test_appends_are_cut_in_even_chunks_one_piece_a_cta.)"""
    costs = np.array([2001] * 133 + [2] * 130)  # (one key tile each beside one of 2000: 16 pieces a CTA unguarded)
    order = order_from_costs(costs)
    assert tail_split(order, costs, heads=1, sms=132, head_dim=128) is None
    with pytest.MonkeyPatch.context() as m:  # (the guard is what refuses: without it the split would be made)
        m.setattr(work_tail, "TAIL_MAX_PIECES", 10 ** 6)
        out = tail_split(order, costs, heads=1, sms=132, head_dim=128)
        assert out is not None and np.diff(section(out, len(costs))["cta_ptr"]).max() > 8


@pytest.mark.parametrize("qo,kv,heads,chunk", [
    ([8], [8192], 8, 4),  # a verify step: 8 items of 64 key tiles, 16 chunks of 4 each (128 pieces)
    ([8] * 4, [8192] * 4, 8, 16),  # 32 items: 4 chunks of 16
    ([16] * 8, [16384] * 8, 8, 64),  # 64 items of 128 tiles: two chunks each
])
def test_appends_are_cut_in_even_chunks_one_piece_a_cta(qo, kv, heads, chunk):
    """Items fewer than the SMs: every item cut at the same multiples of one chunk (the items of a KV head then
    read the same keys at once), one piece a CTA, the chunk the least estimated time (chunk + 1 + MERGE_COST per
    slot merged)."""
    qo, kv = np.array(qo), np.array(kv)
    costs = pair_costs(qo, kv, group=4, q_tiles=1, rows=128, keys=128, lower=0, upper=None)
    order = order_from_costs(costs)
    out = tail_split(order, costs.reshape(-1), heads=heads, sms=132, head_dim=128)
    sec = section(out, len(order))
    assert (np.diff(sec["cta_ptr"]) <= 1).all()
    assert sec["header"][11] == 1  # (spread: the pieces of an item merge side by side, csrc/hopper_tail.cuh)
    firsts = {int(p[1]) for p in sec["pieces"]}
    assert firsts == set(range(0, firsts and max(firsts) + 1, chunk))  # (the same cuts in every item)
    assert all(p[2] - p[1] == chunk for p in sec["pieces"] if p[2] != TAIL_TO_END)


def test_only_chunked_cuts_are_spread():
    """The header's spread word is set where the items fewer than the SMs are cut in chunks (one piece a CTA, no
    rounds), not on a tail behind rounds nor on the stretches of items fewer than the SMs that chunks do not fit
    (a CTA may hold several pieces there, and a spread merge waits on the item's other pieces); a section that
    asks for spread over such pieces is refused."""
    costs = np.array([48] * 200)  # 200 items of 47 tiles on 132 SMs: a tail behind one round
    out = tail_split(order_from_costs(costs), costs, heads=1, sms=132, head_dim=128)
    assert out is not None and section(out, 200)["header"][11] == 0
    costs = np.array([2001] + [3] * 40)  # items fewer than the SMs, chunks cannot cut the short ones: stretches
    with pytest.MonkeyPatch.context() as m:
        m.setattr(work_tail, "FILL_MIN_GAIN", 0.0)
        m.setattr(work_tail, "_chunk_pieces", lambda tiles, ctas: None)
        out = tail_split(order_from_costs(costs), costs, heads=1, sms=132, head_dim=128)
    assert out is not None and section(out, len(costs))["header"][11] == 0
    two = np.array([[0, 5, 0, 4, 0], [0, 6, 0, 4, 1]])  # (two pieces on CTA 0)
    with pytest.raises(ValueError, match="one piece a CTA"):
        work_tail._section(two, 4, 0, 128, 8, spread=True)
    with pytest.raises(ValueError, match="no rounds"):
        work_tail._section(two[:1], 4, 8, 128, 8, spread=True)


def test_no_split_where_chunks_would_not_fit_the_ctas():
    """128 items of 257 key tiles (a chunk of 512 rows over 32k keys) on 132 SMs: two chunks an item would need
    256 CTAs, and a cut where the CTAs' loads meet loses what the items of a head share in L2; the rounds stay."""
    costs = pair_costs(np.array([512]), np.array([32768]), group=4, q_tiles=16, rows=128, keys=128, lower=0,
                       upper=None)
    assert tail_split(order_from_costs(costs), costs.reshape(-1), heads=8, sms=132, head_dim=128) is None


def test_an_order_on_the_device_appends_the_partial_slots():
    """The host section stops at the partial slots; the device tensor holds them behind it, the kernel's
    length check (hopper_tail_load_pieces: s[9] + slots * partial ints <= the section's length) met exactly."""
    qo, kv = np.array([8]), np.array([8192])
    costs = pair_costs(qo, kv, group=4, q_tiles=1, rows=128, keys=128, lower=0, upper=None)
    out = tail_split(order_from_costs(costs), costs.reshape(-1), heads=8, sms=132, head_dim=128)
    dev = work_tail.order_on_device(out, 1, 128, "cpu")
    sec = section(out, 1)
    assert dev.dtype.itemsize == 4 and dev.numel() == 1 + sec["offsets"][4] + sec["slots"] * partial_ints(128)
    np.testing.assert_array_equal(dev[:len(out)].numpy(), out)
    plain = order_from_costs(costs)
    assert work_tail.order_on_device(plain, 1, 128, "cpu").numel() == 1


def dealt_tiles(out: np.ndarray, pairs: int, heads: int, item_tiles: np.ndarray) -> dict:
    """The kernel's dealing of a launch with a tail split, on the CPU (csrc/hopper_prefill.cuh's producer loop with
    hopper_work.cuh hopper_item_at and hopper_tail.cuh hopper_tail_piece_of_round / hopper_tail_cut): {item: the
    key tiles each CTA ran of it, in order}. ``item_tiles``: [items] the key tiles the kernel finds per item (by
    dealing index), which may differ from the plan's estimate."""
    sec = section(out, pairs, heads)  # (the pieces' items as dealing indices: the item_tiles they read)
    ctas, items, cta_ptr = sec["ctas"], pairs * heads, sec["cta_ptr"]
    ran: dict = {}
    for cta in range(ctas):  # (blockIdx.x; gridDim.x is the section's CTAs: hopper_tail_load_pieces)
        mine = sec["pieces"][cta_ptr[cta]:cta_ptr[cta + 1]]
        assert len(mine) <= work_tail.TAIL_MAX_PIECES
        for rnd in range(items + len(mine) + 2):
            idx = rnd * ctas + ((ctas - 1 - cta) if rnd & 1 else cta)  # work_index
            n = -1
            if idx >= items:
                full = items // ctas
                i = (ctas - 1 - cta) if full & 1 else cta
                n = rnd - full - (1 if i < items - full * ctas else 0)  # hopper_tail_piece_of_round
                if n >= len(mine):
                    break
                idx = int(mine[n][0])
            pair = int(out[idx // heads]) - (pairs if n >= 0 else 0)
            num_kt = int(item_tiles[idx]) if 0 <= pair < pairs else 0
            if not 0 <= pair < pairs and n < 0:
                continue  # (an item the rounds skip: the tail's)
            first, end = 0, num_kt
            if n >= 0 and mine[n][3] >= 0:  # hopper_tail_cut of a split item's piece
                first = min(max(int(mine[n][1]), 0), num_kt)
                end = num_kt if mine[n][2] == TAIL_TO_END else min(max(int(mine[n][2]), first), num_kt)
            ran.setdefault(idx, []).extend(range(first, end))
        else:
            raise AssertionError(f"CTA {cta} never ran out of rounds")
    return ran


@pytest.mark.parametrize("qo,kv,heads,lower,extra", [
    ([8], [8192], 8, 0, 0),  # a verify step: fewer items than SMs, all taken
    ([8, 16, 3], [4096, 8192, 300], 8, 0, 1),  # (the kernel finding a tile more per item than the plan)
    ([8, 16, 3], [4096, 8192, 300], 8, None, -1),  # (and one fewer)
    ([8192], [8192], 8, None, 0),  # full attention: 2048 items, the last round's taken
    ([700, 300], [2000, 300], 3, None, 0),
])
def test_the_kernels_dealing_runs_every_key_tile_once(qo, kv, heads, lower, extra):
    qo, kv = np.array(qo), np.array(kv)
    group, sms = 4, 132
    q_tiles = -(-int(qo.max()) * group // 128)
    costs = pair_costs(qo, kv, group=group, q_tiles=q_tiles, rows=128, keys=128, lower=lower, upper=None)
    order = order_from_costs(costs)
    pairs = len(order)
    out = tail_split(order, costs.reshape(-1), heads=heads, sms=sms, head_dim=128)
    assert out is not None
    planned = np.repeat(costs.reshape(-1)[order], heads) - 1  # [items] in dealing order (-1: no rows)
    found = np.where(planned >= 0, np.clip(planned + extra, 0, None), 0)
    ran = dealt_tiles(out, pairs, heads, found)
    for item in range(pairs * heads):
        if planned[item] < 0:
            assert not ran.get(item), item  # (no rows: nothing)
            continue
        assert sorted(ran.get(item, [])) == list(range(int(found[item]))), item  # every tile once, no other
