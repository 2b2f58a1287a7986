"""The decode workspace's plan buffer (CPU): the declared bounds always hold the planner's output, and
the packed buffer, read the way the CUDA template reads it (DecodePlanView), covers every request's
keys exactly once, writes unsplit requests directly and lists each split request's partial states in
key order for the merge. TVM's decode plan slot (compact offsets) gives the same plan, and the C++
packer writes, word for word, what a straightforward packing of the plan's arrays writes, in both
layouts."""
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attngen
from attngen.runtime import AttentionArgumentError
from attngen.runtime.decode_plan import DecodeBounds, items_needed, workspace_ints
from attngen.runtime.planner import PackedLayout, PlannerCapacity, SplitKVPlanner, plan_layout_ints
from attngen.schedules.cost_model import decode_min_chunk

MIN_CHUNK = decode_min_chunk(128)  # the decode planner's floor at head dim 128

BOUNDED, COMPACT = PackedLayout("bounded"), PackedLayout("compact")

BOUNDS = [DecodeBounds(max_batch=64, num_ctas=33), DecodeBounds(max_batch=16, num_ctas=132)]


@pytest.fixture(scope="module")
def cache(build_cache):
    return build_cache  # the planner library, built once per session (test_planner loads it too)


def planner_for(bounds, cache):
    return SplitKVPlanner(bounds.capacity, template="decode", cache=cache)


def reference_pack(buf, plan, room, *, counter_heads=0, fused_merge=False):
    """The plan's arrays written one section after another (csrc/decode_plan_pack.h), each section with
    ``room`` = (CTAs, work items, merges, partials) entries of space; returns the buffer's size."""
    ctas, items, merges, partials = room
    sizes = [ctas + 1, 5 * items, 2 * merges, merges + 1, partials]
    offsets = list(np.cumsum([8] + sizes))
    counters = offsets[5] if counter_heads else 0
    buf[:8] = [len(plan.merge_tiles), len(plan.cta_indptr) - 1, *offsets[:5], counters if fused_merge else 0]
    for at, section in zip(offsets, (plan.cta_indptr, plan.work, plan.merge_tiles, plan.merge_indptr,
                                     plan.merge_partials)):
        buf[at:at + section.size] = section.reshape(-1)
    return offsets[5] + merges * counter_heads


def unpack(buf):
    """The device view of the buffer: per CTA its work items, and the merge map."""
    n_merge, ctas = int(buf[0]), int(buf[1])
    o_cta, o_work, o_tiles, o_mptr, o_parts = (int(x) for x in buf[2:7])
    cta_indptr = buf[o_cta:o_cta + ctas + 1]
    items = [buf[o_work + 5 * w:o_work + 5 * w + 5] for c in range(ctas)
             for w in range(cta_indptr[c], cta_indptr[c + 1])]
    merges = []
    for m in range(n_merge):
        lo, hi = buf[o_mptr + m], buf[o_mptr + m + 1]
        merges.append((int(buf[o_tiles + 2 * m]), [int(x) for x in buf[o_parts + lo:o_parts + hi]]))
    return items, merges


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_packed_plan_covers_every_key_once(cache, data):
    base = BOUNDS[data.draw(st.integers(0, len(BOUNDS) - 1))]
    batch = data.draw(st.integers(0, base.max_batch))
    lens = np.array(data.draw(st.lists(st.one_of(st.integers(0, 600), st.integers(0, 40000)), min_size=batch,
                                       max_size=batch)), np.int32)
    group = data.draw(st.sampled_from([1, 4, 8]))
    fixed = data.draw(st.sampled_from([0, 0, 512]))
    # the workspace grows for what a fixed-chunk plan needs, as CUDAAttention.plan_decode does
    bounds = DecodeBounds(base.max_batch, base.num_ctas, items_needed(lens, fixed))
    planner = planner_for(bounds, cache)
    plan = planner.plan(np.ones(batch, np.int32), lens, num_ctas=bounds.num_ctas, group=group, tile_rows=16,
                        fixed_chunk=fixed, min_chunk=MIN_CHUNK)  # never over the declared bounds
    buf = np.full(workspace_ints(bounds, cache=cache), -7, np.int32)
    assert planner.pack(plan, buf, BOUNDED) == len(buf)
    items, merges = unpack(buf)
    n_merge = len(plan.merge_tiles)
    assert n_merge == len(merges)
    covered = {b: [] for b in range(batch)}
    slots = {}
    for request, tile, start, end, slot in items:
        assert tile == 0 and 0 <= start <= end <= lens[request]
        covered[int(request)].append((int(start), int(end)))
        if slot >= 0:
            slots.setdefault(int(request), []).append((int(start), int(slot)))
    for b in range(batch):
        spans = sorted(covered[b])
        assert spans[0][0] == 0 and spans[-1][1] == lens[b]
        assert all(a[1] == c[0] for a, c in zip(spans, spans[1:]))  # contiguous, no overlap
        limit = fixed or max(MIN_CHUNK, plan.chunk_limit)
        assert all(e - s <= limit for s, e in spans)
        split = len(spans) > 1
        assert (b in slots) == split  # a split request writes partial states only; others write directly
    assert {b: [s for _, s in sorted(v)] for b, v in slots.items()} == dict(merges)  # merge in key order
    tvm = np.full(len(buf), -7, np.int32)
    n, tvm_merges = planner.plan_decode_packed(lens, tvm, num_ctas=bounds.num_ctas, group=group, fixed_chunk=fixed,
                                               min_chunk=MIN_CHUNK)
    assert tvm_merges == n_merge and n <= len(tvm)
    tvm_items, tvm_merge_map = unpack(tvm)  # compact offsets, the same items per CTA and the same merges
    assert [list(map(int, i)) for i in tvm_items] == [list(map(int, i)) for i in items] and tvm_merge_map == merges
    compact = np.full(len(buf), -7, np.int32)
    assert planner.pack(plan, compact, COMPACT) == n and np.array_equal(compact, tvm)  # one packer, one plan


def test_fixed_chunk_items_counted():
    lens = np.array([0, 1, 512, 513, 8192], np.int32)
    assert items_needed(lens, 512) == 1 + 1 + 1 + 2 + 16
    assert items_needed(lens, 0) == 0
    assert DecodeBounds(64, 33, items_needed(np.full(8, 8192), 512)).max_work_items == 128


def test_fused_merge_counters_follow_the_plan_and_start_at_zero(cache):
    """With the fused merge, word 7 points past the five plan arrays at max_merges x Hkv counters, inside
    the buffer and zero (the decode kernel counts arrivals there); without it word 7 is 0 and the buffer
    has no counter region."""
    bounds, hkv = BOUNDS[0], 8
    planner = planner_for(bounds, cache)
    lens = np.array([30000] + [512] * 63, np.int32)
    plan = planner.plan(np.ones(64, np.int32), lens, num_ctas=bounds.num_ctas, group=4, tile_rows=16,
                        min_chunk=MIN_CHUNK)
    assert workspace_ints(bounds, hkv, cache=cache) == workspace_ints(bounds, cache=cache) + bounds.max_merges * hkv
    buf = np.zeros(workspace_ints(bounds, hkv, cache=cache), np.int32)
    planner.pack(plan, buf, PackedLayout("bounded", merge_counter_heads=hkv, fused_merge=True))
    assert len(plan.merge_tiles) >= 1
    at = int(buf[7])
    assert at == workspace_ints(bounds, cache=cache) and at + bounds.max_merges * hkv == len(buf)
    assert not buf[at:].any()
    assert unpack(buf)[1] and all(len(parts) > 1 for _, parts in unpack(buf)[1])
    plain = np.zeros(workspace_ints(bounds, cache=cache), np.int32)
    planner.pack(plan, plain, BOUNDED)
    assert plain[7] == 0 and np.array_equal(plain[:7], buf[:7])
    with pytest.raises(AttentionArgumentError, match="fused_merge: the layout has no merge counters"):
        planner.pack(plan, plain, PackedLayout("bounded", fused_merge=True))


def test_fused_merge_choice_follows_the_plan(cache):
    """The default merge choice: fused when some request writes its output directly (a short request beside
    a split one), the merge kernel when every request is split; an explicit choice wins."""
    from attngen.runtime.decode_plan import choose_fused_merge

    planner = SplitKVPlanner(PlannerCapacity(64, 200, 200, 64, max_ctas=33), cache=cache)
    skewed = planner.plan(np.ones(4, np.int32), np.array([30000, 300, 200, 100], np.int32), num_ctas=33,
                          group=4, min_chunk=256)
    alone = planner.plan(np.ones(1, np.int32), np.array([30000], np.int32), num_ctas=33, group=4, min_chunk=256)
    assert (skewed.work[:, 4] < 0).any() and (alone.work[:, 4] >= 0).all() and len(alone.work) > 1
    assert choose_fused_merge(skewed.work, None) is True
    assert choose_fused_merge(alone.work, None) is False
    assert choose_fused_merge(alone.work, True) is True and choose_fused_merge(skewed.work, False) is False
    assert choose_fused_merge(alone.work, None, graph_safe=True) is True


@pytest.mark.parametrize("lens,hkv,expect", [
    ([65536], 8, 33),             # one request split over every column, one piece per CTA
    ([16384] * 16, 8, 2),         # two chunks per request, at most one item per CTA
    ([4096] * 32, 32, 1),         # MHA: 8 columns x 32 heads leave 8 of 264 slots empty; 4 waves, no split
    ([1024] * 64, 8, 0),          # short items, two per CTA, every slot used: the plan
    ([4096] * 64, 8, 0),          # no split, 512 CTAs on 264 slots (under two waves): the plan
    ([4096] * 66, 8, 0),          # no split, two full waves, but the plan's columns fill every slot: the plan
    ([4096] * 16, 32, 0),         # no split, slots left empty, but under two waves: the plan
    ([32768] + [512] * 63, 8, 0),  # skewed: the plan
    ([0] * 4, 8, 0),              # nothing to read
])
def test_grid_launch_chosen_only_for_uniform_batches_it_serves(cache, lens, hkv, expect):
    """H200 shapes (2 CTAs per SM x 132 SMs = 264 slots; plan columns = slots // KV heads)."""
    from attngen.runtime.decode_plan import grid_chunks_for_uniform_batch

    slots = 264
    bounds = DecodeBounds(max_batch=128, num_ctas=slots // hkv)
    lens = np.array(lens, np.int32)
    plan = planner_for(bounds, cache).plan(np.ones(len(lens), np.int32), lens, num_ctas=bounds.num_ctas, group=4,
                                           tile_rows=16, min_chunk=MIN_CHUNK)
    chunks = grid_chunks_for_uniform_batch(lens, plan, hkv, slots)
    assert chunks == expect
    if chunks > 0:  # the grid launch's split (decode_tc.cuh, grid mode) is the plan's partition of each request
        span = int(lens[0])
        grid = [(span * c // chunks, span * (c + 1) // chunks) for c in range(chunks)]
        for b in range(len(lens)):
            items = sorted((int(lo), int(hi)) for r, _, lo, hi, _ in plan.work if r == b)
            assert items == grid


@pytest.mark.parametrize("head_dim,slots,expect", [(64, 264, 32), (128, 264, 16), (256, 264, 16)])
def test_short_batches_split_down_to_the_head_dims_shortest_chunk(cache, head_dim, slots, expect):
    """One request of 2k keys (H200 shapes: 264 CTA slots, 8 KV heads): the chunk limit stops at the head dim's
    shortest chunk (64 keys at D 64, 128 at D 128 and 256: decode_2026-12-03_chunks.md), each chunk on a CTA of
    its own, so the grid launch takes the same partition; a batch with more work per column than that is planned
    by work per column alone."""
    from attngen.runtime.decode_plan import grid_chunks_for_uniform_batch

    hkv = 8
    bounds = DecodeBounds(max_batch=64, num_ctas=slots // hkv)
    planner = planner_for(bounds, cache)
    one = planner.plan(np.ones(1, np.int32), np.array([2048], np.int32), num_ctas=bounds.num_ctas, group=4,
                       tile_rows=16, min_chunk=decode_min_chunk(head_dim))
    assert one.chunk_limit == decode_min_chunk(head_dim) and len(one.work) == expect
    assert grid_chunks_for_uniform_batch(np.array([2048]), one, hkv, slots) == expect
    busy = planner.plan(np.ones(4, np.int32), np.full(4, 2048, np.int32), num_ctas=bounds.num_ctas, group=4,
                        tile_rows=16, min_chunk=decode_min_chunk(head_dim))
    assert busy.chunk_limit >= -(-4 * 2048 // bounds.num_ctas) > decode_min_chunk(head_dim)


@pytest.mark.parametrize("head_dim,lens,expect_chunk", [
    (128, [512], 64), (256, [512], 64), (128, [200, 180], 64), (128, [300, 200], 128), (64, [512], 64),
    (128, [1024], 128), (128, [2048], 128), (128, [512] * 5, 128), (256, [4096], 128)])
def test_a_tiny_batch_is_cut_at_the_tiny_batch_chunk(cache, head_dim, lens, expect_chunk):
    """33 columns (264 CTA slots over 8 KV heads): a batch whose chunks at the head dim's floor would fill at most
    an eighth of them (one request of 512 keys: 4 chunks of 128) is cut into 64-key chunks (8), which the grid
    launch takes as its partition; more work keeps the floor."""
    from attngen.runtime.decode_plan import grid_chunks_for_uniform_batch

    bounds = DecodeBounds(max_batch=64, num_ctas=33)
    kv = np.array(lens, np.int32)
    floor = decode_min_chunk(head_dim, kv, bounds.num_ctas)
    assert floor == expect_chunk
    plan = planner_for(bounds, cache).plan(np.ones(len(lens), np.int32), kv, num_ctas=bounds.num_ctas, group=4,
                                           tile_rows=16, min_chunk=floor)
    assert plan.chunk_limit >= floor
    assert len(plan.work) == sum(-(-n // plan.chunk_limit) for n in lens)
    if lens == [512]:
        assert plan.chunk_limit == 64 and grid_chunks_for_uniform_batch(kv, plan, 8, 264) == 8


@settings(max_examples=80, deadline=None)
@given(lens=st.lists(st.integers(0, 3000), min_size=1, max_size=12), ctas=st.integers(1, 140),
       head_dim=st.sampled_from([64, 128, 256]))
def test_tvm_slots_cut_tiny_batches_by_the_same_rule(cache, lens, ctas, head_dim):
    """The C++ rule TVM's decode plan slot applies (decode_plan_pack.h decode_chunk_floor, with the head dim's floor
    and DECODE_TINY_BATCH_CHUNK compiled in) picks the chunk the PyTorch path's plans take (cost_model.py)."""
    import tvm_ffi

    from attngen.runtime.planner import planner_library
    from attngen.schedules.cost_model import DECODE_MIN_CHUNK, DECODE_TINY_BATCH_CHUNK

    kv = np.array(lens, np.int32)
    native = planner_library(cache)["decode_chunk_floor"](tvm_ffi.from_dlpack(kv), ctas, DECODE_MIN_CHUNK[head_dim],
                                                          DECODE_TINY_BATCH_CHUNK)
    assert native == decode_min_chunk(head_dim, kv, ctas)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_packer_writes_what_the_plan_arrays_say(cache, data):
    """Word for word (the entries a layout leaves unused untouched) against a packing of the SplitKVPlan
    arrays: bounded (offsets from the capacity; with and without the fused merge's counters) and compact."""
    cap = PlannerCapacity(max_batch=24, max_work_items=600, max_partials=600, max_merge_tiles=300, max_ctas=48)
    planner = SplitKVPlanner(cap, cache=cache)
    batch = data.draw(st.integers(0, cap.max_batch))
    kv = data.draw(st.lists(st.integers(0, 5000), min_size=batch, max_size=batch))
    qo = [data.draw(st.integers(0, min(k, 20))) for k in kv]
    ctas = data.draw(st.integers(1, cap.max_ctas))
    lower = data.draw(st.sampled_from([None, 0]))
    plan = planner.plan(qo, kv, num_ctas=ctas, group=data.draw(st.sampled_from([1, 4])), tile_rows=16,
                        mask_lower=lower, min_chunk=data.draw(st.sampled_from([1, 256])))
    bounds_room = (cap.max_ctas, cap.max_work_items, cap.max_merge_tiles, cap.max_partials)
    plan_room = (ctas, len(plan.work), len(plan.merge_tiles), len(plan.merge_partials))
    for layout, room in ((BOUNDED, bounds_room), (PackedLayout("bounded", 8, False), bounds_room),
                         (PackedLayout("bounded", 8, True), bounds_room), (COMPACT, plan_room)):
        size = reference_pack(np.zeros(1 << 14, np.int32), plan, room, counter_heads=layout.merge_counter_heads)
        if layout.mode == "bounded":
            assert plan_layout_ints(cap, layout, cache=cache) == size
        want, got = np.full(size + 5, -7, np.int32), np.full(size + 5, -7, np.int32)
        reference_pack(want, plan, room, counter_heads=layout.merge_counter_heads, fused_merge=layout.fused_merge)
        assert planner.pack(plan, got, layout) == size
        assert np.array_equal(got, want), layout
        assert got[2] == 8  # (cta_indptr right behind the header: the kernels read it there, test below)


def test_kernels_read_cta_indptr_where_every_plan_puts_it():
    """DecodePlanView reads cta_indptr at a fixed offset (loaded with the header), the packer's first section
    right behind its header words."""
    csrc = Path(attngen.__file__).parent / "csrc"
    at = re.search(r"constexpr int kDecodePlanCtaIndptrAt = (\d+);", (csrc / "decode.cuh").read_text())
    header = re.search(r"constexpr int kPlanHeaderInts = (\d+);", (csrc / "decode_plan_pack.h").read_text())
    assert at and header and int(at.group(1)) == int(header.group(1)) == 8
    assert re.search(r"l\.cta_indptr = at;\s+at \+= s\.ctas \+ 1;", (csrc / "decode_plan_pack.h").read_text())


def test_pack_takes_only_the_latest_plan_into_a_buffer_that_holds_it(cache):
    planner = SplitKVPlanner(PlannerCapacity(8, 64, 64, 8, max_ctas=8), cache=cache)
    first = planner.plan([1, 1], [3000, 10], num_ctas=8, group=4)
    planner.plan([1], [10], num_ctas=8, group=4)
    with pytest.raises(AttentionArgumentError, match="not this planner's latest plan"):
        planner.pack(first, np.zeros(1024, np.int32), COMPACT)
    latest = planner.plan([1, 1], [3000, 10], num_ctas=8, group=4)
    need = planner.layout_ints(BOUNDED)
    with pytest.raises(AttentionArgumentError, match=rf"buf: holds {need - 1} entries, the plan needs {need}"):
        planner.pack(latest, np.zeros(need - 1, np.int32), BOUNDED)
    with pytest.raises(AttentionArgumentError, match="expected a contiguous 1-D int32 host tensor"):
        planner.pack(latest, np.zeros(need, np.int64), BOUNDED)


@pytest.mark.parametrize("head_dim,kv_bytes,layout,hkv,group,tensor_cores,expect", [
    (128, 1, "NHD", 8, 4, True, 2),    # fp8 rows of 128 bytes: pairs
    (64, 1, "NHD", 8, 4, True, 2),     # fp8 rows of 64 bytes
    (64, 2, "NHD", 2, 1, True, 2),     # 16-bit rows of 128 bytes
    (128, 2, "NHD", 8, 4, True, 1),    # 16-bit rows of 256 bytes: already long runs
    (256, 1, "NHD", 8, 4, True, 1),    # fp8 rows of 256 bytes
    (128, 1, "HND", 8, 4, True, 1),    # a head's rows run page-long in HND
    (128, 1, "NHD", 3, 4, True, 1),    # an odd number of KV heads
    (128, 1, "NHD", 8, 5, True, 1),    # 2 x 5 query rows exceed the tile's 8
    (128, 1, "NHD", 8, 4, False, 1),   # the CUDA-core template
])
def test_kv_heads_per_cta_pairs_short_nhd_rows_automatically(head_dim, kv_bytes, layout, hkv, group, tensor_cores,
                                                             expect):
    from attngen.runtime.decode_plan import kv_heads_per_cta

    args = dict(head_dim=head_dim, kv_bytes=kv_bytes, layout=layout, num_kv_heads=hkv, group=group,
                tensor_cores=lambda: tensor_cores)
    assert kv_heads_per_cta(None, **args) == expect
    assert kv_heads_per_cta(1, **args) == 1  # one head per CTA serves every call
    fits = expect == 2 or layout == "HND"  # an HND call may ask for pairs; the automatic choice does not take them
    if fits:
        assert kv_heads_per_cta(2, **args) == 2
    else:
        with pytest.raises(AttentionArgumentError, match=r"kv_heads_per_cta=2: .*pass 1 or None"):
            kv_heads_per_cta(2, **args)
    with pytest.raises(AttentionArgumentError, match=r"kv_heads_per_cta: must be 1, 2 or None"):
        kv_heads_per_cta(3, **args)


@pytest.mark.parametrize("lens,hkv,expect", [
    ([4096] * 64, 8, 2),          # B 64 L 4k: pairs gained 5% (fp8) on an H100
    ([16384] * 16, 8, 2),         # B 16 L 16k: +4.5%
    ([65536], 8, 2),              # B 1 L 64k: level
    ([2048], 8, 1),               # B 1 L 2k: too little work, -12% at D 64
    ([32768] + [512] * 63, 8, 1),  # one long request among short ones: -9%
    ([4096] * 32, 32, 2),         # MHA
])
def test_automatic_pairs_only_for_batches_that_pay(lens, hkv, expect):
    """The automatic pairing from the H100 A/B (kv_pairs_2026-12-05_h100.md): enough (token, KV head) pairs and
    no request far longer than the mean; an explicit request is not second-guessed."""
    from attngen.runtime.decode_plan import kv_heads_per_cta

    args = dict(head_dim=128, kv_bytes=1, layout="NHD", num_kv_heads=hkv, group=4, tensor_cores=lambda: True)
    assert kv_heads_per_cta(None, kv_lens=lens, **args) == expect
    assert kv_heads_per_cta(2, kv_lens=lens, **args) == 2
    # an NHD pool whose heads lie apart (kv_pool.heads_adjacent False): never paired automatically, still on request
    assert kv_heads_per_cta(None, kv_lens=lens, adjacent_heads=False, **args) == 1
    assert kv_heads_per_cta(2, kv_lens=lens, adjacent_heads=False, **args) == 2
