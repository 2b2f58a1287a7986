"""attngen.testing.causal_slices: a reference over three blocks of a long request's rows, each with its keys cut
at its last row's position, equals the full reference on those rows for masks that hide every later key (causal,
causal sliding window), and differs where a mask shows later keys (a full-attention variant)."""
import numpy as np
import pytest

from attngen.runtime.reference import reference_attention
from attngen.testing import causal_slices, random_problem
from attngen.variants import builtin


def _problem(rng):
    return random_problem(rng, [700, 0, 5, 300], [900, 7, 5, 300], 4, 2, 16, dtype="float64")


@pytest.mark.parametrize("name,params", [("causal", {}), ("sliding_window_causal", {"window_left": 40})])
def test_sliced_reference_matches_the_full_one_on_its_rows(name, params, rng):
    prob = _problem(rng)
    v = builtin(name)
    full_o, full_l = reference_attention(v, prob.q, prob.keys, prob.values, prob.qo_indptr, 0.25, params)
    picked, sliced = causal_slices(prob, 64)
    # requests of more than 3 x 64 rows give three blocks of 64 (first, middle, last), the others stay whole
    assert len(picked) == 3 * 64 + 0 + 5 + 3 * 64 and sliced.qo_lens == [64] * 3 + [0, 5] + [64] * 3
    assert sliced.kv_lens[:3] == [900 - 700 + 64, 900 - 700 + 350 - 32 + 64, 900] and sliced.kv_lens[3:5] == [7, 5]
    o, lse = reference_attention(v, sliced.q, sliced.keys, sliced.values, sliced.qo_indptr, 0.25, params)
    np.testing.assert_allclose(o, full_o[picked], rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, full_l[picked], rtol=0, atol=1e-12)


def test_a_mask_showing_later_keys_is_not_sliceable(rng):
    prob = _problem(rng)
    v = builtin("vanilla")
    full_o, _ = reference_attention(v, prob.q, prob.keys, prob.values, prob.qo_indptr, 0.25, {})
    picked, sliced = causal_slices(prob, 64)
    o, _ = reference_attention(v, sliced.q, sliced.keys, sliced.values, sliced.qo_indptr, 0.25, {})
    assert np.abs(o - full_o[picked]).max() > 1e-3
