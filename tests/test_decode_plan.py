"""The decode workspace's plan buffer (CPU): the declared bounds always hold the planner's output, and
the packed buffer, read the way the CUDA template reads it (DecodePlanView), covers every request's
keys exactly once, writes unsplit requests directly and lists each split request's partial states in
key order for the merge. The C++ packer (the one TVM's decode plan slot runs) gives the same plan."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attngen.codegen.cache import BuildCache
from attngen.runtime.decode_plan import MIN_CHUNK, DecodeBounds, items_needed, pack_plan, workspace_ints
from attngen.runtime.planner import PlannerCapacity, SplitKVPlanner

BOUNDS = [DecodeBounds(max_batch=64, num_ctas=33), DecodeBounds(max_batch=16, num_ctas=132)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return BuildCache(tmp_path_factory.mktemp("planner"))


def planner_for(bounds, cache):
    return SplitKVPlanner(PlannerCapacity(bounds.max_batch, bounds.max_work_items, bounds.max_partials,
                                          bounds.max_merges, max_ctas=bounds.num_ctas), template="decode", cache=cache)


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
    buf = np.full(workspace_ints(bounds), -7, np.int32)
    n_merge = pack_plan(buf, bounds, plan)
    items, merges = unpack(buf)
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
    cxx = np.full(workspace_ints(bounds), -7, np.int32)
    n, cxx_merges = planner.plan_decode_packed(lens, cxx, num_ctas=bounds.num_ctas, group=group, fixed_chunk=fixed,
                                               min_chunk=MIN_CHUNK)
    assert cxx_merges == n_merge and n <= len(cxx)
    cxx_items, cxx_merge_map = unpack(cxx)  # compact offsets, the same items per CTA and the same merges
    assert [list(map(int, i)) for i in cxx_items] == [list(map(int, i)) for i in items] and cxx_merge_map == merges


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
    assert workspace_ints(bounds, hkv) == workspace_ints(bounds) + bounds.max_merges * hkv
    buf = np.zeros(workspace_ints(bounds, hkv), np.int32)
    n_merge = pack_plan(buf, bounds, plan, fused_merge=True)
    assert n_merge == len(plan.merge_tiles) >= 1
    at = int(buf[7])
    assert at == workspace_ints(bounds) and at + bounds.max_merges * hkv == len(buf)
    assert not buf[at:].any()
    assert unpack(buf)[1] and all(len(parts) > 1 for _, parts in unpack(buf)[1])
    plain = np.zeros(workspace_ints(bounds), np.int32)
    pack_plan(plain, bounds, plan)
    assert plain[7] == 0 and np.array_equal(plain[:7], buf[:7])


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
