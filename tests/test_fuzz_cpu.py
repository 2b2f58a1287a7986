"""Fuzzing the CPU backend: random variants composed from hook fragments, random batches, NaN / Inf
injected, malformed arguments. Each call must match the float64 reference or be refused with attngen's own
error naming the argument; never a crash, a hang or a silent wrong answer (see tests/fuzz_engine.py).

The CI part is bounded: a fixed pool of recipes (each built once per session) and a fixed number of
derandomized examples. benchmarks/fuzz_long.py runs the whole recipe space for as long as asked.
Examples the fuzzer once failed on are kept below as regression tests.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .fuzz_engine import FAULTS, Recipe, built, make_case, run_case

# every fragment appears at least once; both states; elementwise and whole-row row hooks
CI_RECIPES = (
    Recipe(("alibi", "softcap"), ("causal",), "affine", "none", "head_bias"),
    Recipe(("scale",), ("window", "custom"), "reverse", "swap", "lse"),
    Recipe((), ("stripe",), "none", "scale", "none", "sum"),
    Recipe(("softcap",), (), "none", "none", "affine"),
)

FUZZ = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


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
