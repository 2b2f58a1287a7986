"""Fuzzing the CPU backend: random variants composed from hook fragments, random batches, NaN / Inf
injected, malformed arguments. Each call must match the float64 reference or be refused with attngen's own
error naming the argument; never a crash, a hang or a silent wrong answer (see tests/fuzz_engine.py and, for the
views, tests/fuzz_views.py, whose ``make_case`` and ``run_case`` take every case kind).

The CI part is bounded: a fixed pool of recipes (each built once per session) and a fixed number of
derandomized examples. benchmarks/fuzz_long.py runs the whole recipe space for as long as asked.
Examples the fuzzer once failed on are kept below as regression tests.

The views over the prefill (cascade levels, block-sparse layouts, appends followed by a read) are fuzzed the
same way over their own pool of recipes (``VIEW_RECIPES``), with their own faults (``VIEW_FAULTS``), and so are
fp8 caches (tests/fuzz_fp8.py: ``FP8_FAULTS``).
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .fuzz_engine import FAULTS, Recipe, built
from .fuzz_fp8 import (FP8_FAULTS, FP8_KV_DTYPES, FP8_VIEW_KINDS, built_fp8, make_fp8_case, run_fp8_case,
                       run_fp8_view_case)
from .fuzz_views import VIEW_FAULTS, VIEW_KINDS, make_case, run_case

# every fragment appears at least once; both states; elementwise and whole-row row hooks
CI_RECIPES = (
    Recipe(("alibi", "softcap"), ("causal",), "affine", "none", "head_bias"),
    Recipe(("scale",), ("window", "custom"), "reverse", "swap", "lse"),
    Recipe((), ("stripe", "chunk"), "none", "scale", "none", "sum"),
    Recipe(("softcap",), (), "none", "none", "affine"),
)

def fuzz_settings(examples: int):
    """Hypothesis settings of the CI fuzz tests: a fixed sequence of ``examples`` draws, no deadline."""
    return settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


FUZZ = fuzz_settings(60)


@pytest.fixture(scope="module")
def modules(build_cache):
    return {r: built(r, build_cache) for r in CI_RECIPES}


@FUZZ
@given(recipe=st.sampled_from(CI_RECIPES), seed=st.integers(0, 2**32 - 1), fault=st.sampled_from(FAULTS))
def test_fuzz_calls(modules, recipe, seed, fault):
    variant, att = modules[recipe]
    run_case(variant, att, make_case(variant, seed), fault, np.random.default_rng(seed + 1))


@FUZZ
@given(recipe=st.sampled_from(CI_RECIPES), seed=st.integers(0, 2**32 - 1))
def test_fuzz_valid_calls_with_nonfinite_inputs(modules, recipe, seed):
    variant, att = modules[recipe]
    run_case(variant, att, make_case(variant, seed), "none", np.random.default_rng(seed))


# fp8 caches (tests/fuzz_fp8.py): each CI recipe over one fp8 format, the formats alternating
FP8_RECIPES = tuple((r, FP8_KV_DTYPES[i % 2]) for i, r in enumerate(CI_RECIPES))


@pytest.fixture(scope="module")
def fp8_modules(build_cache):
    return {rk: built_fp8(*rk, cache=build_cache) for rk in FP8_RECIPES}


@FUZZ
@given(recipe=st.sampled_from(FP8_RECIPES), seed=st.integers(0, 2**32 - 1), fault=st.sampled_from(FP8_FAULTS))
def test_fuzz_fp8_calls(fp8_modules, recipe, seed, fault):
    """Calls over fp8 caches at random scales match the reference on the dequantised values, or are refused by
    name (spoilt scales, raw bytes, an unquantised cache, fp8 queries)."""
    variant, att = fp8_modules[recipe]
    case = make_fp8_case(variant, seed, recipe[1])
    run_fp8_case(variant, att, case, fault, np.random.default_rng(seed + 1))


# (recipe index in CI_RECIPES, seed) the fuzzer failed on before the kernels followed the reference's
# non-finite rules: a NaN / +inf score gave O = 0, lse = -inf (an "empty" row) instead of NaN
NONFINITE_REGRESSIONS = [(0, 13), (0, 52), (1, 16), (1, 18), (3, 57), (3, 67)]


@pytest.mark.parametrize("recipe_index,seed", NONFINITE_REGRESSIONS)
def test_fuzz_regressions_nonfinite(modules, recipe_index, seed):
    variant, att = modules[CI_RECIPES[recipe_index]]
    case = make_case(variant, seed)
    assert case.injected
    assert run_case(variant, att, case, "none", np.random.default_rng(seed)) == "ok"


# A gap the fuzzer found, now closed (check_tensor refuses tensors on torch's 'meta' device): the examples
# that found it, kept as regression tests.
DEVICE_GAP_EXAMPLES = [  # (recipe, seed): once a RuntimeError from the FFI; once accepted with an empty batch
    (Recipe(("alibi", "softcap"), ("causal",), "affine", "none", "head_bias"), 0),
    (Recipe(("alibi", "softcap"), ("custom", "stripe"), "affine", "swap", "affine", "sum"), 3326255511),
]


@pytest.mark.parametrize("recipe,seed", DEVICE_GAP_EXAMPLES)
def test_fuzz_regression_meta_device_is_refused(build_cache, recipe, seed):
    from .fuzz_engine import _checked_call, apply_fault

    variant, att = built(recipe, build_cache)
    case = make_case(variant, seed)
    call = apply_fault(case, "meta_device", np.random.default_rng(seed + 1))
    _checked_call(variant, att, case, call, "meta_device", "meta device")


# ---- views: cascade, block-sparse, append ---------------------------------------------------------------
# a variant without positions, a causal mask alone (its cascade's earlier levels and its block rows before the
# diagonal run on the unmasked sibling; a headwise view refuses it: its query hook reads qo_head), a sum state,
# and one the cascade and block-sparse views must refuse (ALiBi reads positions; appends take any variant)
VIEW_RECIPES = (
    Recipe(("softcap",), (), "reverse", "scale"),
    Recipe(("scale",), ("causal",), "affine", "swap"),
    Recipe((), (), "none", "swap", "none", "sum"),
    CI_RECIPES[0],
    Recipe((), (), "none", "none", "lse"),  # an output transform reading lse: cascades run it flat only
)

VIEW_FUZZ = fuzz_settings(200)


@pytest.fixture(scope="module")
def view_modules(build_cache):
    return {r: built(r, build_cache) for r in VIEW_RECIPES}


@VIEW_FUZZ
@given(recipe=st.sampled_from(VIEW_RECIPES), kind=st.sampled_from(VIEW_KINDS), seed=st.integers(0, 2**32 - 1),
       data=st.data())
def test_fuzz_view_calls(view_modules, recipe, kind, seed, data):
    """Spoilt view calls are refused by name (a refused append writes nothing); valid ones match the reference."""
    fault = data.draw(st.sampled_from(VIEW_FAULTS[kind]), label="fault")
    variant, att = view_modules[recipe]
    run_case(variant, att, make_case(variant, seed, kinds=(kind,)), fault, np.random.default_rng(seed + 1))


@VIEW_FUZZ
@given(recipe=st.sampled_from(VIEW_RECIPES), kind=st.sampled_from(VIEW_KINDS), seed=st.integers(0, 2**32 - 1))
def test_fuzz_valid_view_calls(view_modules, recipe, kind, seed):
    """Random levels, layouts and appends (empty and odd-length requests, page permutations, NaN / Inf at times)
    match the float64 reference over the keys each row sees, or are refused for a variant the view cannot serve."""
    variant, att = view_modules[recipe]
    run_case(variant, att, make_case(variant, seed, kinds=(kind,)), "none", np.random.default_rng(seed))


# Gaps the view fuzzer found, closed since (each was a wrong answer or an unclear error): the same inputs now
# come out right or refused by name, as the oracle expects (run_case raises otherwise); the spoilt ones refused
CLOSED_VIEW_GAPS = [  # (recipe, kind, seed, fault)
    # attention_sink-like output transform over a prefix level and a suffix level: ran a merged cascade, O wrong
    (Recipe((), (), "none", "none", "lse"), "cascade", 9, "none"),
    # a level with one page list for two groups: IndexError
    (VIEW_RECIPES[0], "cascade", 0, "level_kv_group_count"),
    # causal; a prefix of one page with last_page_len 0: refused as "mode='flat' ... use mode='cascade'"
    (VIEW_RECIPES[1], "cascade", 0, "level_last_page_len_zero"),
    # BlockSparseView(indptr, indices, block_rows=0, 4, 4).as_paged(pages): ZeroDivisionError
    (VIEW_RECIPES[0], "bsr", 11, "bsr_block_rows_zero"),
    # BlockSparseView(...).as_paged(pages, "NDH"): "indices: key block ids must be in [0, Hkv), got ..."
    (VIEW_RECIPES[0], "bsr", 11, "bsr_layout_unknown"),
]


@pytest.mark.parametrize("recipe,kind,seed,fault", CLOSED_VIEW_GAPS)
def test_closed_view_gaps_stay_closed(build_cache, recipe, kind, seed, fault):
    variant, att = built(recipe, build_cache)
    outcome = run_case(variant, att, make_case(variant, seed, kinds=(kind,)), fault, np.random.default_rng(seed + 1))
    assert outcome in ("ok", "refused:AttentionArgumentError") and (fault == "none" or outcome != "ok"), outcome


# fp8 pools under the views (tests/fuzz_fp8.py run_fp8_view_case): three view recipes (a causal one among them:
# its unmasked sibling is built for fp8 caches too), the two formats in turn
FP8_VIEW_RECIPES = tuple((r, FP8_KV_DTYPES[i % 2]) for i, r in enumerate(VIEW_RECIPES[:3]))


@pytest.fixture(scope="module")
def fp8_view_modules(build_cache, view_modules):
    return {rk: (view_modules[rk[0]], built_fp8(*rk, cache=build_cache)[1]) for rk in FP8_VIEW_RECIPES}


@FUZZ
@given(recipe=st.sampled_from(FP8_VIEW_RECIPES), kind=st.sampled_from(FP8_VIEW_KINDS),
       seed=st.integers(0, 2**32 - 1))
def test_fuzz_views_over_fp8_pools(fp8_view_modules, recipe, kind, seed):
    """A cascade or block-sparse view over an fp8 pool (random scales, NaN / Inf inputs at times) equals the
    same view over the float32 pool of the values it holds."""
    (variant, att32), att8 = fp8_view_modules[recipe]
    run_fp8_view_case(variant, att32, att8, make_case(variant, seed, kinds=(kind,)), recipe[1], seed)
