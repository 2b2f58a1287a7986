"""Cascade attention on the CPU backend: shared-prefix + per-request suffix levels equal flat attention."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attngen.runtime import AttentionArgumentError, CPUAttention, PagedKV, reference_attention
from attngen.runtime.cascade import CascadeAttention, CascadeLevel
from attngen.runtime.reference import gather_pages
from attngen.variants import builtin

D, S = 32, 4  # head dim, page size


@pytest.fixture(scope="module")
def modules(build_cache):
    # the session's build cache and test_cpu_backend's layouts: one library per variant for the session (the tests run NHD only)
    return {n: CPUAttention.build(builtin(n), head_dims=(D,), layouts=("NHD", "HND"), cache=build_cache)
            for n in ("vanilla", "logits_softcap", "sigmoid", "causal")}


def build_case(rng, groups, n_kv=2, group=2):
    """groups: [(prefix_pages, [(qo_len, suffix_len) per request])]. Returns q, levels, flat view."""
    n_pages = sum(p + sum((sl + S - 1) // S for _, sl in reqs) for p, reqs in groups) + 2
    pages = rng.standard_normal((n_pages, 2, S, n_kv, D)).astype(np.float32)
    ids = iter(rng.permutation(n_pages).astype(np.int32))
    lvl0_q, lvl0_pages, lvl1_q, lvl1_pages, lvl1_last, flat_pages, flat_last = [0], [], [0], [], [], [], []
    rows = 0
    for prefix, reqs in groups:
        pre = [next(ids) for _ in range(prefix)]
        lvl0_pages.append(pre)
        for qo, sl in reqs:
            suf = [next(ids) for _ in range((sl + S - 1) // S)]
            lvl1_pages.append(suf)
            lvl1_last.append(sl - (len(suf) - 1) * S if suf else 0)
            flat_pages.append(pre + suf)
            flat_last.append(lvl1_last[-1] if suf else (S if pre else 0))
            rows += qo
            lvl1_q.append(rows)
        lvl0_q.append(rows)

    def view(page_lists, last):
        indptr = np.concatenate([[0], np.cumsum([len(p) for p in page_lists])]).astype(np.int32)
        idx = np.array([i for p in page_lists for i in p], np.int32)
        return PagedKV(pages, indptr, idx, np.array(last, np.int32))

    q = rng.standard_normal((rows, n_kv * group, D)).astype(np.float32)
    lvl0 = CascadeLevel(np.array(lvl0_q, np.int32), view(lvl0_pages, [S if p else 0 for p in lvl0_pages]))
    lvl1 = CascadeLevel(np.array(lvl1_q, np.int32), view(lvl1_pages, lvl1_last))
    return q, [lvl0, lvl1], view(flat_pages, flat_last), np.array(lvl1_q, np.int32)


def nan_outputs(q):
    """(out like q, lse [rows, Hq] float32), filled with NaN."""
    return np.full_like(q, np.nan), np.full(q.shape[:2], np.nan, np.float32)


cases = st.lists(st.tuples(st.integers(0, 3), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9)),
                                                        min_size=1, max_size=3)), min_size=1, max_size=3)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), cases, st.sampled_from(["vanilla", "logits_softcap", "sigmoid"]))
def test_cascade_equals_flat_attention(modules, seed, groups, name):
    rng = np.random.default_rng(seed)
    att = modules[name]
    q, levels, flat, qo_indptr = build_case(rng, groups)
    params = {p.name: p.default for p in att.variant.params}  # the scalar parameters' defaults
    f_out, f_lse = att.prefill(q, flat, qo_indptr, sm_scale=0.25, params=params)
    keys, vals = gather_pages(flat.pages, flat.indptr, flat.indices, flat.last_page_len)
    ref, _ = reference_attention(att.variant, q, keys, vals, qo_indptr, 0.25, params)
    cascade = CascadeAttention(att)
    for mode in ("cascade", "flat"):  # the levels merged, and the levels' page lists concatenated
        plan = cascade.plan(levels, q.shape[0], D, mode=mode)
        assert plan.mode == (mode if q.shape[0] else "cascade")
        out, lse = nan_outputs(q)  # (every row must be written: NaN left anywhere fails)
        got = cascade.run(q, plan=plan, sm_scale=0.25, params=params, out=out, lse=lse)
        assert got[0] is out and got[1] is lse
        assert not np.isnan(out).any() and not np.isnan(lse).any()
        if out.size == 0:
            continue
        assert np.abs(out - f_out).max() < 1e-5
        if name != "sigmoid":
            assert np.array_equal(np.isneginf(lse), np.isneginf(f_lse))
            live = np.isfinite(f_lse)
            assert np.abs(lse[live] - f_lse[live]).max(initial=0) < 1e-5
        assert np.abs(out - ref).max() < 1e-4


@pytest.mark.parametrize("name,reader", [("sliding_window_causal", "logits_mask"), ("rope", "query_transform")])
def test_position_dependent_variants_are_refused(name, reader, build_cache):
    """Beyond a causal mask alone: a window (the earlier levels are not shown whole) or a hook reading positions
    (the levels number their keys from 0)."""
    att = CPUAttention.build(builtin(name), head_dims=(D,), layouts=("NHD", "HND"), cache=build_cache)
    with pytest.raises(AttentionArgumentError, match=rf"{reader} reads qo_pos.*flat view"):
        CascadeAttention(att)


causal_cases = st.lists(st.tuples(st.integers(0, 3), st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 5)).map(lambda t: (t[0], t[0] + t[1])), min_size=1, max_size=3)),
    min_size=1, max_size=3)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), causal_cases, st.integers(1, 6))
def test_causal_cascade_equals_flat_causal_attention(modules, seed, groups, max_chunks):
    """A causal variant: the shared prefixes (split into chunks) run unmasked, each request's suffix, holding at
    least its query tokens, runs causally; the merged result is causal attention over the concatenated keys with
    true positions (the flat prefill and the float64 reference), in cascade and flat modes."""
    rng = np.random.default_rng(seed)
    att = modules["causal"]
    q, levels, flat, qo_indptr = build_case(rng, groups)
    f_out, f_lse = att.prefill(q, flat, qo_indptr, sm_scale=0.25)
    keys, vals = gather_pages(flat.pages, flat.indptr, flat.indices, flat.last_page_len)
    ref, _ = reference_attention(att.variant, q, keys, vals, qo_indptr, 0.25, {})
    cascade = CascadeAttention(att)
    for mode in ("cascade", "flat"):
        plan = cascade.plan(levels, q.shape[0], D, mode=mode, max_chunks=max_chunks, chunk_keys=S)
        out, lse = nan_outputs(q)
        got = cascade.run(q, plan=plan, sm_scale=0.25, out=out, lse=lse)
        assert got[0] is out and got[1] is lse
        if out.size == 0:
            continue
        assert not np.isnan(out).any() and not np.isnan(lse).any()
        assert np.abs(out - f_out).max() < 1e-5 and np.abs(out - ref).max() < 1e-4
        assert np.array_equal(np.isneginf(lse), np.isneginf(f_lse))
        live = np.isfinite(f_lse)
        assert np.abs(lse[live] - f_lse[live]).max(initial=0) < 1e-5
    if q.shape[0]:
        assert cascade.unmasked().variant.name == "causal_unmasked"
        assert cascade.unmasked().functions == att.functions


def test_a_causal_cascade_checks_its_levels(modules, rng):
    """Its last level must hold each group's query tokens, and its flat form keeps the levels' key order (a
    prefix ending on a partial page cannot go first)."""
    att = modules["causal"]
    q, levels, _, _ = build_case(rng, [(2, [(3, 2)])])  # 3 query rows, 2 suffix keys
    with pytest.raises(AttentionArgumentError, match=r"levels\[1\]: group 0 has 3 query rows but 2 keys"):
        CascadeAttention(att).plan(levels, q.shape[0], D, mode="cascade")
    q, levels, _, _ = build_case(rng, [(2, [(2, 8)])])  # the suffix: two whole pages
    partial = levels[0].kv.last_page_len.copy()
    partial[0] = 1  # the prefix's last page holds one key
    levels[0] = CascadeLevel(levels[0].qo_indptr, PagedKV(levels[0].kv.pages, levels[0].kv.indptr,
                                                          levels[0].kv.indices, partial))
    with pytest.raises(AttentionArgumentError, match="a page list before their last ends on a partial page"):
        CascadeAttention(att).plan(levels, q.shape[0], D, mode="flat")
    plan = CascadeAttention(att).plan(levels, q.shape[0], D, mode="auto")  # auto: the cascade, as it cannot go flat
    assert plan.mode == "cascade"
    # a last-level group over two earlier groups (two sequences' rows numbered as one): refused in every mode
    q, levels, _, _ = build_case(rng, [(1, [(2, 4)]), (1, [(2, 4)])])
    merged = CascadeLevel(np.array([0, 4], np.int32), PagedKV(levels[1].kv.pages, np.array([0, 1], np.int32),
                                                              levels[1].kv.indices[:1], np.array([S], np.int32)))
    for mode in ("cascade", "flat", "auto"):
        with pytest.raises(AttentionArgumentError, match=r"levels\[0\].qo_indptr: its boundary 2 splits a group"):
            CascadeAttention(att).plan([levels[0], merged], q.shape[0], D, mode=mode)


def test_a_level_page_table_is_checked_and_named(modules, rng):
    """Each level's page table holds one page list per group, its page ids inside the cache and its last page
    lengths in [1, page_size]; a refusal names the level."""
    q, levels, _, _ = build_case(rng, [(1, [(2, 3), (1, 2)])])
    lvl1 = levels[1]
    short = CascadeLevel(lvl1.qo_indptr, PagedKV(lvl1.kv.pages, lvl1.kv.indptr[:2], lvl1.kv.indices,
                                                 lvl1.kv.last_page_len[:1]))
    zero = CascadeLevel(levels[0].qo_indptr, PagedKV(levels[0].kv.pages, levels[0].kv.indptr, levels[0].kv.indices,
                                                     np.zeros(1, np.int32)))
    cascade = CascadeAttention(modules["vanilla"])
    for mode in ("flat", "auto", "cascade"):
        with pytest.raises(AttentionArgumentError, match=r"levels\[1\]\.kv\.indptr: has 2 entries, expected "
                                                         r"batch_size \+ 1 = 3 \(one page list per group"):
            cascade.plan([levels[0], short], q.shape[0], D, mode=mode)
        with pytest.raises(AttentionArgumentError, match=r"levels\[0\]\.kv\.last_page_len: must be in \[1, "):
            cascade.plan([zero, lvl1], q.shape[0], D, mode=mode)
    causal = CascadeAttention(modules["causal"])
    with pytest.raises(AttentionArgumentError, match=r"levels\[0\]\.kv\.last_page_len"):
        causal.plan([zero, lvl1], q.shape[0], D, mode="flat")


def test_an_output_transform_runs_flat(build_cache, rng):
    """A variant whose output transform reads lse (attention_sink) would be transformed once per level before
    the merge: the cascade runs it flat (auto), refuses mode='cascade', and matches flat attention."""
    att = CPUAttention.build(builtin("attention_sink"), head_dims=(D,), cache=build_cache)
    q, levels, flat, qo_indptr = build_case(rng, [(2, [(2, 3), (1, 6)]), (1, [(3, 1)])])
    params = {"sink": rng.standard_normal(q.shape[1]).astype(np.float32)}  # one sink logit per query head
    cascade = CascadeAttention(att)
    with pytest.raises(AttentionArgumentError, match="mode='cascade': variant 'attention_sink' has an output "
                                                     "transform"):
        cascade.plan(levels, q.shape[0], D, mode="cascade")
    plan = cascade.plan(levels, q.shape[0], D, mode="auto")
    assert plan.mode == "flat"
    out, lse = cascade.run(q, plan=plan, params=params)
    f_out, f_lse = att.prefill(q, flat, qo_indptr, params=params)
    assert np.array_equal(out, f_out) and np.array_equal(lse, f_lse)


def test_levels_must_cover_all_rows(modules, rng):
    q, levels, _, _ = build_case(rng, [(1, [(2, 3)])])
    bad = CascadeLevel(np.array([0, 1], np.int32), levels[0].kv)
    with pytest.raises(AttentionArgumentError, match=r"levels\[0\].qo_indptr: must cover all 2 query rows"):
        CascadeAttention(modules["vanilla"]).run(q, [bad])


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 9), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9)),
                                                               min_size=1, max_size=4),
       st.integers(1, 12), st.integers(1, 6), st.sampled_from(["vanilla", "logits_softcap", "sigmoid"]))
def test_split_shared_prefix_equals_flat_attention(modules, seed, prefix_pages, reqs, chunk_keys, max_chunks, name):
    """A prompt shared by the whole batch is split along its pages into chunks whose states are merged: the
    result is flat attention, for any chunk size, including chunks of one page and a partial last page."""
    rng = np.random.default_rng(seed)
    att = modules[name]
    q, levels, flat, qo_indptr = build_case(rng, [(prefix_pages, reqs)])
    params = {p.name: p.default for p in att.variant.params}
    cascade = CascadeAttention(att)
    plan = cascade.plan(levels, q.shape[0], D, max_chunks=max_chunks, chunk_keys=chunk_keys, mode="cascade")
    expect = min(max_chunks, prefix_pages, -(-prefix_pages * S // chunk_keys)) if q.shape[0] else 1
    assert plan.levels[0].chunks == max(expect, 1)
    for _ in range(2):  # the plan serves every call (layer)
        out, lse = cascade.run(q, plan=plan, sm_scale=0.25, params=params)
        f_out, f_lse = att.prefill(q, flat, qo_indptr, sm_scale=0.25, params=params)
        assert not np.isnan(out).any() and not np.isnan(lse).any()
        assert out.shape == f_out.shape and lse.shape == f_lse.shape
        assert np.abs(out - f_out).max(initial=0) < 1e-5
        if name != "sigmoid":
            live = np.isfinite(f_lse)
            assert np.array_equal(live, np.isfinite(lse))
            assert np.abs(lse[live] - f_lse[live]).max(initial=0) < 1e-5


def test_plan_is_tied_to_its_row_count(modules, rng):
    q, levels, _, _ = build_case(rng, [(2, [(2, 3), (1, 1)])])
    cascade = CascadeAttention(modules["vanilla"])
    plan = cascade.plan(levels, q.shape[0], D)
    with pytest.raises(AttentionArgumentError, match=r"plan: made for 3 query rows, q has 2"):
        cascade.run(q[:2], plan=plan)
    with pytest.raises(AttentionArgumentError, match=r"run: pass the levels or a plan"):
        cascade.run(q)


def test_auto_mode_runs_flat_unless_the_cascade_saves_enough(modules, rng, monkeypatch):
    """Small shared prefixes run flat (one attention over concatenated page lists, a decode when every row
    group is one row); where the saved K/V bytes exceed the threshold, the levels run as a cascade."""
    from attngen.runtime import cascade as cascade_mod

    att = modules["vanilla"]
    q, levels, flat, qo_indptr = build_case(rng, [(3, [(1, 5), (1, 2), (1, 0)]), (2, [(1, 7)])])
    kv, cuts, flat_keys, unique_keys = cascade_mod.flatten_levels(levels, [lv.qo_indptr for lv in levels])
    assert cuts.tolist() == qo_indptr.tolist()
    assert flat_keys == 3 * (3 * S) + 5 + 2 + 2 * S + 7  # each request reads its prefix and its suffix
    assert unique_keys == 3 * S + 2 * S + 5 + 2 + 7
    cascade = CascadeAttention(att)
    plan = cascade.plan(levels, q.shape[0], D)
    assert plan.mode == "flat" and plan.levels[0].decode  # one row per request: a decode
    out, lse = cascade.run(q, plan=plan, sm_scale=0.25)
    f_out, f_lse = att.prefill(q, flat, qo_indptr, sm_scale=0.25)
    assert np.abs(out - f_out).max() < 1e-5 and np.abs(lse - f_lse).max() < 1e-5
    saved = (flat_keys - unique_keys) * 2 * 2 * D * 4  # K and V, 2 KV heads, fp32
    monkeypatch.setattr(cascade_mod, "CASCADE_MIN_SAVED_BYTES", saved + 1)
    assert cascade.plan(levels, q.shape[0], D).mode == "flat"
    monkeypatch.setattr(cascade_mod, "CASCADE_MIN_SAVED_BYTES", saved)
    plan = cascade.plan(levels, q.shape[0], D)
    assert plan.mode == "cascade" and len(plan.levels) == 2
    out, lse = cascade.run(q, plan=plan, sm_scale=0.25)
    assert np.abs(out - f_out).max() < 1e-5


def test_flat_mode_needs_concatenable_page_lists(modules, rng):
    """A row group whose prefix and suffix both end on a partial page has no flat view: "flat" says so,
    "auto" keeps the cascade."""
    q, levels, flat, qo_indptr = build_case(rng, [(2, [(2, 3)])])
    lv0 = levels[0]
    partial = CascadeLevel(lv0.qo_indptr, PagedKV(lv0.kv.pages, lv0.kv.indptr, lv0.kv.indices,
                                                  np.array([S - 1], np.int32)))
    cascade = CascadeAttention(modules["vanilla"])
    with pytest.raises(AttentionArgumentError, match=r"mode='flat'.*rows 0..1: 2 of their page lists end on a "
                                                     r"partial page.*mode='cascade'"):
        cascade.plan([partial, levels[1]], q.shape[0], D, mode="flat")
    assert cascade.plan([partial, levels[1]], q.shape[0], D).mode == "cascade"
    with pytest.raises(AttentionArgumentError, match=r"mode: one of"):
        cascade.plan(levels, q.shape[0], D, mode="fast")


def test_three_levels_cascade_and_flat_equal_reference(modules, rng):
    """A prompt shared by every row, a prefix per pair of requests and a suffix per request (partial last
    pages): the cascade, its flat view and the float64 reference agree."""
    att = modules["vanilla"]
    n_kv, group, rows_per_req = 2, 2, [1, 3, 2, 1]
    pages = rng.standard_normal((20, 2, S, n_kv, D)).astype(np.float32)
    ids = list(rng.permutation(20).astype(np.int32))
    take = lambda n: [ids.pop() for _ in range(n)]  # noqa: E731
    shared, pair = take(2), [take(1), take(2)]
    suffix_lens = [3, 0, 6, 1]
    suffix = [take(-(-n // S)) for n in suffix_lens]
    qo = np.concatenate([[0], np.cumsum(rows_per_req)]).astype(np.int32)

    def view(lists, last):
        indptr = np.concatenate([[0], np.cumsum([len(p) for p in lists])]).astype(np.int32)
        return PagedKV(pages, indptr, np.array([i for p in lists for i in p], np.int32), np.array(last, np.int32))

    levels = [CascadeLevel(qo[[0, -1]], view([shared], [S])),
              CascadeLevel(qo[[0, 2, 4]], view(pair, [S, S])),
              CascadeLevel(qo, view(suffix, [n - (len(p) - 1) * S if p else 0 for n, p in zip(suffix_lens, suffix)]))]
    flat = view([shared + pair[r // 2] + suffix[r] for r in range(4)],
                [n - (len(p) - 1) * S if p else S for n, p in zip(suffix_lens, suffix)])
    q = rng.standard_normal((int(qo[-1]), n_kv * group, D)).astype(np.float32)
    keys, vals = gather_pages(flat.pages, flat.indptr, flat.indices, flat.last_page_len)
    ref, ref_lse = reference_attention(att.variant, q, keys, vals, qo, 0.25, {})
    cascade = CascadeAttention(att)
    for mode in ("cascade", "flat"):
        plan = cascade.plan(levels, q.shape[0], D, mode=mode, chunk_keys=S)
        assert plan.mode == mode and len(plan.levels) == (3 if mode == "cascade" else 1)
        out, lse = cascade.run(q, plan=plan, sm_scale=0.25)
        assert np.abs(out - ref).max() < 1e-4
        assert np.abs(lse - ref_lse).max() < 1e-4
