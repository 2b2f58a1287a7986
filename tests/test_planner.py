"""Properties of the split-KV planner (Algorithm 2): coverage, balance, determinism, bounds."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attngen.runtime import AttentionArgumentError
from attngen.runtime.planner import PlannerCapacity, PlanRequest, SplitKVPlanner, named_options, planner_library

CAP = PlannerCapacity(max_batch=64, max_work_items=20000, max_partials=20000, max_merge_tiles=5000)


@pytest.fixture(scope="module")
def cache(build_cache):
    return build_cache  # the planner library, built once per session (test_decode_plan loads it too)


@pytest.fixture(scope="module")
def planner(cache):
    return SplitKVPlanner(CAP, cache=cache)


def visible(qo, kv, group, tile_rows, lower, upper):
    """Reference visible KV range of every query tile: {(request, tile): (lo, hi)}."""
    out = {}
    for b, (q, k) in enumerate(zip(qo, kv)):
        rows = q * group
        for t in range((rows + tile_rows - 1) // tile_rows):
            r0, r1 = t * tile_rows, min(rows, (t + 1) * tile_rows)
            first, last = k - q + r0 // group, k - q + (r1 - 1) // group
            lo = max(0, first - upper) if upper is not None else 0
            hi = min(k, last - lower + 1) if lower is not None else k
            out[(b, t)] = (lo, max(lo, hi))
    return out


batches = st.tuples(
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3000)), min_size=1, max_size=24),
    st.sampled_from([1, 4, 5, 8]),  # group
    st.sampled_from([16, 64]),  # tile rows
    st.integers(1, 200),  # CTAs
    st.sampled_from([(None, None), (0, None), (0, 100), (None, 50)]),  # mask bounds (lower, upper)
)


@settings(max_examples=120, deadline=None)
@given(batches)
def test_every_query_tile_key_pair_is_covered_exactly_once(planner, case):
    reqs, group, tile_rows, ctas, (lower, upper) = case
    qo = [min(q, k) if lower is not None else q for q, k in reqs]  # causal plans: qo_len <= kv_len
    kv = [k for _, k in reqs]
    plan = planner.plan(qo, kv, num_ctas=ctas, group=group, tile_rows=tile_rows, mask_lower=lower, mask_upper=upper)
    want = visible(qo, kv, group, tile_rows, lower, upper)
    got: dict = {}
    for b, t, lo, hi, _ in plan.work:
        assert lo <= hi
        got.setdefault((b, t), []).append((lo, hi))
    assert set(got) == set(want)  # every tile appears, even one with no visible key
    for tile, spans in got.items():
        spans.sort()
        lo, hi = want[tile]
        assert spans[0][0] == lo and spans[-1][1] == hi
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, disjoint
        if hi > lo:
            assert all(s[1] > s[0] for s in spans)  # no empty chunk beside real ones
    assert plan.cta_indptr[0] == 0 and plan.cta_indptr[-1] == len(plan.work)


@settings(max_examples=120, deadline=None)
@given(batches)
def test_partials_and_merge_map(planner, case):
    reqs, group, tile_rows, ctas, _ = case
    qo, kv = [q for q, _ in reqs], [k for _, k in reqs]
    plan = planner.plan(qo, kv, num_ctas=ctas, group=group, tile_rows=tile_rows)
    per_tile = {}
    for b, t, lo, hi, slot in plan.work:
        per_tile.setdefault((b, t), []).append((lo, slot))
    merged = {(int(b), int(t)): plan.merge_partials[plan.merge_indptr[i]:plan.merge_indptr[i + 1]].tolist()
              for i, (b, t) in enumerate(plan.merge_tiles)}
    slots = []
    for tile, items in per_tile.items():
        if len(items) == 1:
            assert items[0][1] == -1 and tile not in merged  # written directly, never merged
        else:
            assert all(s >= 0 for _, s in items)
            assert merged[tile] == [s for _, s in sorted(items)]  # merge order is KV order
            slots += merged[tile]
    assert sorted(slots) == list(range(len(slots)))  # each partial slot used exactly once


@settings(max_examples=120, deadline=None)
@given(batches)
def test_makespan_bound_under_the_cost_model(planner, case):
    reqs, group, tile_rows, ctas, _ = case
    qo, kv = [q for q, _ in reqs], [k for _, k in reqs]
    plan = planner.plan(qo, kv, num_ctas=ctas, group=group, tile_rows=tile_rows)
    if len(plan.work) == 0:
        return
    rows = np.array([min(tile_rows, q * group - t * tile_rows) for b, t, *_ in plan.work
                     for q in [qo[b]]])
    cost = planner.alpha * rows + planner.beta * (plan.work[:, 3] - plan.work[:, 2])
    per_cta = [cost[plan.cta_indptr[c]:plan.cta_indptr[c + 1]].sum() for c in range(ctas)]
    lower_bound = max(cost.sum() / ctas, cost.max())
    assert max(per_cta) <= lower_bound + cost.max() + 1e-6


def test_deterministic_and_fixed_split_is_batch_invariant(planner):
    a = planner.plan([1, 3, 7], [5000, 17, 9000], num_ctas=50, group=4)
    b = planner.plan([1, 3, 7], [5000, 17, 9000], num_ctas=50, group=4)
    for f in ("cta_indptr", "work", "merge_tiles", "merge_indptr", "merge_partials"):
        assert np.array_equal(getattr(a, f), getattr(b, f))
    alone = planner.plan([1], [9000], num_ctas=50, fixed_chunk=1024)
    crowd = planner.plan([1, 1, 1], [300, 9000, 12000], num_ctas=50, fixed_chunk=1024)
    spans = lambda p, b: sorted((lo, hi) for r, _, lo, hi, _ in p.work if r == b)  # noqa: E731
    assert spans(alone, 0) == spans(crowd, 1)  # the same request is cut the same way in any batch


def test_skewed_batch_is_balanced(planner):
    kv = [32768] + [512] * 63
    plan = planner.plan([1] * 64, kv, num_ctas=132, group=4, tile_rows=16)
    cost = plan.work[:, 3] - plan.work[:, 2] + 4
    per_cta = [cost[plan.cta_indptr[c]:plan.cta_indptr[c + 1]].sum() for c in range(132)]
    assert max(per_cta) <= 1.5 * (sum(kv) / 132 + 4)  # the long request no longer dominates


def test_bounds_are_named(planner):
    small = SplitKVPlanner(PlannerCapacity(max_batch=4, max_work_items=10, max_partials=4, max_merge_tiles=2))
    with pytest.raises(AttentionArgumentError, match=r"max_batch: the batch has 5 requests"):
        small.plan([1] * 5, [10] * 5, num_ctas=4)
    with pytest.raises(AttentionArgumentError, match=r"max_work_items: the plan needs \d+ work items"):
        small.plan([1], [100000], num_ctas=64)
    with pytest.raises(AttentionArgumentError, match=r"max_partials: the plan needs \d+ partial states"):
        small.plan([1], [1000], num_ctas=8)
    with pytest.raises(AttentionArgumentError, match=r"num_ctas: 0 is outside"):
        small.plan([1], [10], num_ctas=0)


def test_min_chunk_floors_the_chunk_limit(planner):
    kv = np.array([5000] + [10] * 20, np.int32)
    p = planner.plan(np.ones(21, np.int32), kv, num_ctas=132, group=4, min_chunk=256)
    assert p.chunk_limit == 256
    assert ((p.work[:, 3] - p.work[:, 2]) <= 256).all()
    assert (p.work[:, 0] == 0).sum() == -(-5000 // 256)


def test_uniform_batch_is_cut_into_pieces_that_pack():
    """16 requests of 16k keys on 33 CTAs: the plain limit ceil(W / C) cuts 48 chunks (two per busy CTA);
    the planner's candidate limits find 32 chunks of 8k, one per CTA."""
    planner = SplitKVPlanner(CAP)
    kv = np.full(16, 16384, np.int32)
    plan = planner.plan(np.ones(16, np.int32), kv, num_ctas=33, group=4, tile_rows=16)
    cost = planner.alpha * 4 + planner.beta * (plan.work[:, 3] - plan.work[:, 2])
    per_cta = [cost[plan.cta_indptr[c]:plan.cta_indptr[c + 1]].sum() for c in range(33)]
    ideal = cost.sum() / 33
    assert max(per_cta) <= 1.05 * ideal
    assert len(plan.work) == 32 and plan.chunk_limit == 8192


def test_huge_chunk_limits_still_cover_every_key(planner):
    """A fixed chunk or minimum chunk near the int64 limit is clamped: one chunk per request, none dropped."""
    for kwargs in ({"fixed_chunk": 2**63 - 1}, {"min_chunk": 2**63 - 1}):
        plan = planner.plan([1, 1], [5000, 0], num_ctas=8, **kwargs)
        assert sorted((int(b), int(lo), int(hi)) for b, _, lo, hi, _ in plan.work) == [(0, 0, 5000), (1, 0, 0)]


def test_options_cross_the_ffi_by_name(planner, cache):
    """The one-shot export plans from named options like the planner object does; a missing, unknown or
    mistyped key is an error naming it."""
    import tvm_ffi

    lib = planner_library(cache)
    request = PlanRequest(num_ctas=50, alpha=planner.alpha, beta=planner.beta, group=4, tile_rows=16)
    outputs = {"cta_indptr": np.zeros(51, np.int32), "work": np.zeros(500, np.int32),
               "merge_tiles": np.zeros(100, np.int32), "merge_indptr": np.zeros(51, np.int32),
               "merge_partials": np.zeros(100, np.int32)}
    qo, kv = np.array([1, 3, 7], np.int32), np.array([5000, 17, 9000], np.int32)

    def one_shot(request_map, capacity_map=named_options(CAP)):
        return lib["plan_split_kv"](request_map, capacity_map, qo, kv,
                                    tvm_ffi.Map({k: tvm_ffi.from_dlpack(v) for k, v in outputs.items()}))

    counts = one_shot(named_options(request))
    want = planner.plan(qo, kv, num_ctas=50, group=4, tile_rows=16)
    assert counts["work_items"] == len(want.work) and counts["merges"] == len(want.merge_tiles)
    assert np.array_equal(outputs["work"][:want.work.size].reshape(-1, 5), want.work)
    assert np.array_equal(outputs["cta_indptr"], want.cta_indptr)
    fields = dict(named_options(request).items())
    with pytest.raises(TypeError, match="request: missing key 'min_chunk'"):
        one_shot(tvm_ffi.Map({k: v for k, v in fields.items() if k != "min_chunk"}))
    with pytest.raises(TypeError, match="request: unknown key 'window'"):
        one_shot(tvm_ffi.Map({**fields, "window": 4}))
    with pytest.raises(TypeError, match=r"request\['group'\]: expected an integer"):
        one_shot(tvm_ffi.Map({**fields, "group": "four"}))
    with pytest.raises(TypeError, match="capacity: unknown key 'max_pages'"):
        one_shot(named_options(request), tvm_ffi.Map({**dict(named_options(CAP).items()), "max_pages": 1}))
    with pytest.raises(ValueError, match="num_ctas: 50 is outside 1..max_ctas=8"):
        one_shot(named_options(request), named_options(PlannerCapacity(64, 2000, 2000, 500, max_ctas=8)))
