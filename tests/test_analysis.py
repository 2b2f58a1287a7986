"""Mask classification (built-ins and tricky equivalents), hook reads and scale folding."""
import pytest
from tvm.script import tirx as T

from attngen import MaskKind, ScalarParam, Variant
from attngen.ir import classify_mask
from attngen.variants import BUILTINS, builtin

EXPECTED_BUILTIN_MASKS = {
    "vanilla": MaskKind.NONE, "causal": MaskKind.CAUSAL, "sliding_window": MaskKind.SLIDING_WINDOW,
    "sliding_window_causal": MaskKind.CAUSAL_WINDOW, "logits_softcap": MaskKind.NONE,
    "alibi": MaskKind.NONE, "custom_mask": MaskKind.ARBITRARY, "rope": MaskKind.NONE,
    "attention_sink": MaskKind.NONE, "sigmoid": MaskKind.NONE,
}


def test_every_builtin_is_classified():
    assert set(EXPECTED_BUILTIN_MASKS) == set(BUILTINS)
    for name, kind in EXPECTED_BUILTIN_MASKS.items():
        assert builtin(name).analysis.mask.kind == kind, name


def test_window_bound_names_its_parameter():
    info = builtin("sliding_window_causal").analysis.mask
    assert str(info.lower) == "0" and str(info.upper) == "window_left"
    assert info.params == ("window_left",)


def _mask(expr_fn):
    return expr_fn


@T.prim_func
def not_greater(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return not (kv_pos > qo_pos)


@T.prim_func
def diff_nonneg(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return qo_pos - kv_pos >= 0


@T.prim_func
def strict_plus_one(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return kv_pos < qo_pos + 1


@T.prim_func
def with_let(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    delta: T.let = qo_pos - kv_pos
    return delta >= 0


@T.prim_func
def window_de_morgan(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                     w: T.int32) -> T.bool:
    return not (kv_pos > qo_pos or kv_pos + w < qo_pos)


@T.prim_func
def constant_window(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return kv_pos >= qo_pos - 16


@T.prim_func
def causal_and_parity(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return kv_pos <= qo_pos and kv_pos % 2 == 0


@T.prim_func
def causal_or_first(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return kv_pos <= qo_pos or batch == 0


@T.prim_func
def shifted_causal(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return kv_pos <= qo_pos + 3


@T.prim_func
def head_dependent(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return kv_pos <= qo_pos + qo_head


@T.prim_func
def always(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return kv_pos == kv_pos


@T.prim_func
def doubled(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return 2 * kv_pos <= 2 * qo_pos  # the simplifier reduces this to kv_pos <= qo_pos


@T.prim_func
def half_slope(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return 2 * kv_pos <= qo_pos


@pytest.mark.parametrize("func,scalars,kind,lower,upper", [
    (not_greater, set(), MaskKind.CAUSAL, "0", None),
    (diff_nonneg, set(), MaskKind.CAUSAL, "0", None),
    (strict_plus_one, set(), MaskKind.CAUSAL, "0", None),
    (with_let, set(), MaskKind.CAUSAL, "0", None),
    (window_de_morgan, {"w"}, MaskKind.CAUSAL_WINDOW, "0", "w"),
    (constant_window, set(), MaskKind.SLIDING_WINDOW, None, "16"),
    (causal_and_parity, set(), MaskKind.ARBITRARY, "0", None),  # still skippable above the diagonal
    (causal_or_first, set(), MaskKind.ARBITRARY, None, None),
    (shifted_causal, set(), MaskKind.ARBITRARY, "-3", None),
    (head_dependent, set(), MaskKind.ARBITRARY, None, None),
    (always, set(), MaskKind.NONE, None, None),
    (doubled, set(), MaskKind.CAUSAL, "0", None),
    (half_slope, set(), MaskKind.ARBITRARY, None, None),  # not a bound on qo_pos - kv_pos
])
def test_mask_classification(func, scalars, kind, lower, upper):
    info = classify_mask(func, scalars)
    assert info.kind == kind
    assert (None if info.lower is None else str(info.lower)) == lower
    assert (None if info.upper is None else str(info.upper)) == upper


def test_window_parameter_must_be_an_integer_scalar_to_bound():
    # a float parameter cannot bound an integer position difference: no bound is claimed
    info = classify_mask(window_de_morgan, set())
    assert info.kind == MaskKind.ARBITRARY and info.upper is None and str(info.lower) == "0"


def test_hook_reads():
    a = builtin("alibi").analysis.reads["logits_transform"]
    assert a.indices == ("s", "qo_pos", "kv_pos", "qo_head") and a.params == ("alibi_slopes",)
    r = builtin("rope").analysis.reads
    assert r["query_transform"].indices == ("in_row", "qo_pos")
    assert r["key_transform"].params == ("rope_scale", "rope_theta")
    m = builtin("custom_mask").analysis.reads["logits_mask"]
    assert "kv_head" not in m.indices and "batch" in m.indices


def test_scale_folding():
    assert builtin("vanilla").analysis.scale.q_scale_log2e
    assert builtin("rope").analysis.scale.q_scale_log2e  # q/k transforms come before the scale
    soft = builtin("logits_softcap").analysis.scale
    assert not soft.q_scale_log2e and soft.logits_log2e
    sig = builtin("sigmoid").analysis.scale
    assert not sig.q_scale_log2e and not sig.logits_log2e


def test_analysis_describes_itself():
    text = builtin("sliding_window_causal").analysis.describe()
    assert "causal_window" in text and "window_left" in text


def test_variant_with_unused_declared_parameter_is_fine():
    v = Variant("v", params=[ScalarParam("unused", "int32", 1)])
    assert v.analysis.reads == {}


def test_variant_names_where_it_was_defined():
    """``defined_at`` (``attngen inspect`` prints it) is the file and line of the ``Variant(...)`` call."""
    import sys

    line = sys._getframe().f_lineno + 1
    v = Variant("here")
    assert v.defined_at == f"{__file__}:{line}"
    path, at = builtin("alibi").defined_at.rsplit(":", 1)
    assert path.endswith("alibi.py") and "Variant(" in open(path).read().splitlines()[int(at) - 1]
    assert v.with_constants().defined_at == v.defined_at
