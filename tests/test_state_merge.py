"""State composition on the CPU backend: exactness against attention over all keys, the algebra, no NaN."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attngen.runtime import CPUAttention, RaggedKV, merge_state, merge_states, merge_states_sum
from attngen.variants import builtin

D = 32


@pytest.fixture(scope="module")
def att(build_cache):
    # the session's build cache and test_cpu_backend's layouts: one library per variant for the session (the tests
    # run NHD only)
    return CPUAttention.build(builtin("vanilla"), head_dims=(D,), layouts=("NHD", "HND"), cache=build_cache)


def attend(att, q, k, v):
    """States (o, lse) of every query over the given keys (one request holding all queries)."""
    n = q.shape[0]
    return att.prefill(q, RaggedKV(k, v, np.array([0, len(k)], np.int32)), np.array([0, n], np.int32),
                       sm_scale=0.3)


def random_state(rng, n, h, empty_frac=0.3):
    v = rng.standard_normal((n, h, D)).astype(np.float32)
    s = (rng.standard_normal((n, h)) * 4).astype(np.float32)
    empty = rng.random((n, h)) < empty_frac
    v[empty] = 0
    s[empty] = -np.inf
    return v, s


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 40), st.integers(1, 5))
def test_merging_any_partition_equals_attention_over_all_keys(att, seed, n_keys, n_parts):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((3, 2, D)).astype(np.float32)
    k = rng.standard_normal((n_keys, 2, D)).astype(np.float32)
    v = rng.standard_normal((n_keys, 2, D)).astype(np.float32)
    full_o, full_s = attend(att, q, k, v)
    part_of = rng.integers(0, n_parts, n_keys)  # arbitrary (non-contiguous) partition, some parts empty
    vs, ss = [], []
    for p in range(n_parts):
        sel = part_of == p
        o, s = attend(att, q, np.ascontiguousarray(k[sel]), np.ascontiguousarray(v[sel]))
        vs.append(o)
        ss.append(s)
    mo, ms = merge_states(np.stack(vs, 1), np.stack(ss, 1))
    assert np.abs(mo - full_o).max() < 1e-5 and np.abs(ms - full_s).max() < 1e-5
    # the same through repeated in-place pairwise merges
    acc_v, acc_s = vs[0].copy(), ss[0].copy()
    for p in range(1, n_parts):
        merge_state(acc_v, acc_s, vs[p], ss[p])
    assert np.abs(acc_v - full_o).max() < 1e-5 and np.abs(acc_s - full_s).max() < 1e-5


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_associative_and_commutative_up_to_rounding(seed):
    rng = np.random.default_rng(seed)
    a, b, c = (random_state(rng, 4, 3) for _ in range(3))

    def m(x, y):
        v, s = x[0].copy(), x[1].copy()
        merge_state(v, s, y[0], y[1])
        return v, s

    left, right = m(m(a, b), c), m(a, m(b, c))
    ab, ba = m(a, b), m(b, a)
    for x, y in ((left, right), (ab, ba)):
        assert np.array_equal(np.isneginf(x[1]), np.isneginf(y[1]))
        assert np.allclose(x[0], y[0], atol=1e-5) and np.allclose(np.nan_to_num(x[1], neginf=0),
                                                                   np.nan_to_num(y[1], neginf=0), atol=1e-5)
        assert not np.isnan(x[0]).any() and not np.isnan(x[1]).any()


def test_empty_states_pass_through_and_stay_empty(rng):
    v, s = random_state(rng, 5, 2, empty_frac=0.0)
    ev, es = np.zeros_like(v), np.full_like(s, -np.inf)
    mv, ms = v.copy(), s.copy()
    merge_state(mv, ms, ev, es)
    assert np.array_equal(mv, v) and np.array_equal(ms, s)  # exactly: the empty side has weight 0
    e2v, e2s = ev.copy(), es.copy()
    merge_state(e2v, e2s, ev, es)
    assert np.all(e2v == 0) and np.all(np.isneginf(e2s))
    out, lse = merge_states(np.stack([ev, ev], 1), np.stack([es, es], 1))
    assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_sum_states_add(rng):
    v = rng.standard_normal((3, 4, 2, D)).astype(np.float32)
    assert np.allclose(merge_states_sum(v), v.sum(1), atol=1e-5)


def test_float16_states_and_torch(rng):
    import torch

    v, s = random_state(rng, 4, 2)
    o, l = merge_states(torch.from_numpy(np.stack([v, v], 1)).half(), torch.from_numpy(np.stack([s, s], 1)))
    assert o.dtype == torch.float16
    live = np.isfinite(s)
    assert np.allclose(o.float().numpy()[live], v[live], atol=2e-3)
    assert np.allclose(l.numpy()[live], s[live] + 1.0, atol=1e-5)  # two equal states: lse + log2(2)


def test_shape_errors():
    from attngen.runtime import AttentionArgumentError

    with pytest.raises(AttentionArgumentError, match=r"do not describe two"):
        merge_state(np.zeros((2, 2, D), np.float32), np.zeros((2, 2), np.float32),
                    np.zeros((2, 3, D), np.float32), np.zeros((2, 3), np.float32))
    with pytest.raises(AttentionArgumentError, match=r"s: shape \(2, 3, 2\), expected \(2, 2, 2\)"):
        merge_states(np.zeros((2, 2, 2, D), np.float32), np.zeros((2, 3, 2), np.float32))


def test_preallocated_outputs_are_checked():
    from attngen.runtime import AttentionArgumentError

    with pytest.raises(AttentionArgumentError, match=r"out, out_lse: shapes"):
        merge_states(np.zeros((2, 2, 2, D), np.float32), np.zeros((2, 2, 2), np.float32),
                     out=np.zeros((1, 2, D), np.float32), out_lse=np.zeros((2, 2), np.float32))


def masked_merge_checked(v, s, vo, so, mask):
    """merge_state(copies of v, s, vo, so, mask=mask) (NumPy or torch), asserted: the flagged rows as the unmasked
    merge, the others (v, s) bit for bit. Returns the masked merge."""
    copy = (lambda x: x.clone()) if hasattr(v, "detach") else (lambda x: x.copy())  # noqa: E731
    same = (lambda a, b: bool((a == b).all())) if hasattr(v, "detach") else np.array_equal  # noqa: E731
    mv, ms = copy(v), copy(s)
    merge_state(mv, ms, vo, so, mask=mask)
    want_v, want_s = copy(v), copy(s)
    merge_state(want_v, want_s, vo, so)
    assert same(mv[~mask], v[~mask]) and same(ms[~mask], s[~mask])
    assert same(mv[mask], want_v[mask]) and same(ms[mask], want_s[mask])
    return mv, ms


def test_a_row_mask_keeps_the_rows_it_leaves_out(rng):
    """merge_state(..., mask): flagged rows merge as without a mask; the others keep (v, s) bit for bit, even
    where v_other / s_other hold NaN and Inf (the rows a padded batch does not fill); bad masks are refused."""
    import torch

    from attngen.runtime import AttentionArgumentError

    v, s = random_state(rng, 6, 3)
    vo, so = random_state(rng, 6, 3)
    vo[[1, 4]], so[[1, 4]] = np.nan, np.inf
    mask = np.array([True, False, True, True, False, False])
    mv, ms = masked_merge_checked(v, s, vo, so, mask)
    tv, ts = torch.from_numpy(v.copy()), torch.from_numpy(s.copy())
    merge_state(tv, ts, torch.from_numpy(vo), torch.from_numpy(so), mask=torch.from_numpy(mask))
    assert np.array_equal(tv.numpy(), mv) and np.array_equal(ts.numpy(), ms)
    for bad, why in ((mask.astype(np.int32), "mask: expected dtype bool"), (mask[:5], r"mask: shape \(5,\)"),
                     (torch.from_numpy(mask), "mask: must be in v's library")):
        with pytest.raises(AttentionArgumentError, match=why):
            merge_state(v.copy(), s.copy(), vo, so, mask=bad)
