"""The logits hook split into row terms and a per-score rest (codegen/logits_split.py): the pair computes
``post * logits(s * scale, ...)`` on random inputs (float64 interpreter), hoists what is row-invariant, and
leaves guarded reads in their branch."""
import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from attngen.codegen.hooks_cuda import lower_hooks_cuda
from attngen.codegen.logits_split import MAX_TERMS, split_logits
from attngen.ir import ScalarParam, TensorParam, Variant
from attngen.ir import tir_utils as tu
from attngen.ir.tir_eval import TIREvaluator, bind_params, eval_scalar_hook
from attngen.variants import builtin

N = 257  # scores per check


@T.prim_func
def head_table_bias(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                    kv_head: T.int32, table: T.Buffer((8, 64), "float32"), c: T.float32) -> T.float32:
    u: T.let[T.float32] = s / c + table[qo_head, kv_pos % 64] * T.exp(table[qo_head, 0])
    return c * T.tanh(u) - T.float32(0.5) * table[qo_head, 1] / c


@T.prim_func
def guarded_read(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                 kv_head: T.int32, bias: T.Buffer((8,), "float32")) -> T.float32:
    return s + T.if_then_else(kv_pos > qo_pos, bias[qo_head], T.float32(0.0))


@T.prim_func
def offset_bias(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                kv_head: T.int32, offset: T.int32) -> T.float32:
    return s + T.Cast("float32", kv_pos - offset) * T.float32(0.5)


@T.prim_func
def _within_window(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                   kv_head: T.int32) -> T.float32:
    return s - T.float32(0.01) * T.Cast("float32", qo_pos - kv_pos + 7)


@T.prim_func
def _shared_term(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                 kv_head: T.int32, w: T.Buffer((8,), "float32")) -> T.float32:
    return T.tanh(s + w[qo_head]) * w[qo_head]


@T.prim_func
def _head_scale(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                kv_head: T.int32, w: T.Buffer((8,), "float32")) -> T.float32:
    return s * w[qo_head] - w[qo_head]


def test_precise_math_only_hoists():
    ls = split_logits(builtin("logits_softcap").hooks["logits_transform"], reassociate=False)
    assert len(tu.collect(ls.score.body, tvm.tirx.Div)) == 1  # the IEEE division stays per score
    assert [str(t) for t in ls.terms] == ["scale", "post"]


@T.prim_func
def select_guarded(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                   kv_head: T.int32, bias: T.Buffer((8,), "float32")) -> T.float32:
    return s + T.Select(kv_pos > qo_pos, bias[qo_head], T.float32(0.0))


@T.prim_func
def score_in_select(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                    kv_head: T.int32) -> T.float32:
    return T.Select(kv_pos <= qo_pos, s, T.float32(-1e4))


@T.prim_func
def score_in_branch(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                    kv_head: T.int32) -> T.float32:
    return T.if_then_else(T.isnan(s) or s > T.float32(1e3), T.float32(1e3), s * T.float32(0.5))


def test_a_read_under_a_per_score_condition_stays_in_its_branch():
    """if_then_else and select (the generated C evaluates the taken value only) keep their reads."""
    for hook in (guarded_read, select_guarded):
        ls = split_logits(hook, reassociate=True)
        assert len(_loads_of(ls.score, "bias")) == 1
        assert not any(_loads_of_expr(t, "bias") for t in ls.terms)


def _loads_of_expr(e, name):
    return [x for x in tu.collect(e, tvm.ir.TensorLoad) if x.source.name == name]


def _variants():
    custom = [
        Variant("head_table_bias", logits_transform=head_table_bias,
                params=[TensorParam("table", "float32", (8, 64)), ScalarParam("c", "float32", 3.0)]),
        Variant("guarded_read", logits_transform=guarded_read, params=[TensorParam("bias", "float32", (8,))]),
        Variant("within_window", logits_transform=_within_window),
        Variant("offset_bias", logits_transform=offset_bias, params=[ScalarParam("offset", "int32", 3)]),
        Variant("head_scale", logits_transform=_head_scale, params=[TensorParam("w", "float32", (8,))]),
        Variant("shared_term", logits_transform=_shared_term, params=[TensorParam("w", "float32", (8,))]),
        Variant("score_in_select", logits_transform=score_in_select),
        Variant("score_in_branch", logits_transform=score_in_branch),
    ]
    return [builtin("alibi"), builtin("logits_softcap"), builtin("sigmoid")] + custom


def _extras(variant, rng):
    out = {}
    for p in variant.params:
        if isinstance(p, TensorParam):
            shape = tuple(8 if not isinstance(d, int) else d for d in p.shape)
            out[p.name] = rng.uniform(0.2, 1.5, shape)
        else:
            out[p.name] = float(rng.uniform(2.0, 40.0))
    return out


@pytest.mark.parametrize("reassociate", [True, False])
@pytest.mark.parametrize("variant", _variants(), ids=lambda v: v.name)
def test_the_pair_computes_the_scaled_hook(variant, reassociate, rng):
    func = variant.hooks["logits_transform"]
    ls = split_logits(func, reassociate)
    extras = _extras(variant, rng)
    s = rng.normal(0, 30, N)
    batch = np.zeros(N, np.int64)
    qo_pos, kv_pos = rng.integers(0, 500, N), rng.integers(0, 500, N)
    qo_head = rng.integers(0, 8, N)
    kv_head = qo_head // 2
    scale, post = 0.088, 1.4427
    want = post * eval_scalar_hook(func, [s * scale, batch, qo_pos, kv_pos, qo_head, kv_head], extras)
    ev = TIREvaluator(bind_params(ls.row, [batch, qo_pos, qo_head, kv_head, scale, post, None], extras))
    rt = np.zeros((MAX_TERMS, N))
    for i, term in enumerate(ls.terms):
        rt[i] = ev.expr(term)
    got = eval_scalar_hook(ls.score, [s, batch, qo_pos, kv_pos, kv_pos.astype(np.float64), qo_head, kv_head, rt],
                           extras)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert ls.reassociated == reassociate
    if ls.post_scale >= 0:  # the templates' interior path: the rest with rt[k] = 1, times rt[k]
        unit = rt.copy()
        unit[ls.post_scale] = 1.0
        g = eval_scalar_hook(ls.score, [s, batch, qo_pos, kv_pos, kv_pos.astype(np.float64), qo_head, kv_head, unit],
                             extras)
        np.testing.assert_allclose(g * rt[ls.post_scale], want, rtol=1e-12, atol=1e-12)


def _loads_of(func, name):
    return [x for x in tu.collect(func.body, tvm.ir.TensorLoad) if x.source.name == name]


def test_softcap_per_score_is_one_multiply_tanh_multiply():
    ls = split_logits(builtin("logits_softcap").hooks["logits_transform"], reassociate=True)
    assert ls.n_terms == 2
    assert not tu.collect(ls.score.body, tvm.tirx.Div)  # the division by the cap became a row term
    code = lower_hooks_cuda(builtin("logits_softcap"), 128, "sm_90a").code
    from_terms = code[code.rindex("logits_from_terms(float s"):]  # the definition, after the prototypes
    from_terms = from_terms[from_terms.index("{"):from_terms.index("}")]
    assert "__fdividef" not in from_terms and from_terms.count("__tanhf") == 1


def test_alibi_reads_its_slope_once_per_row_and_takes_float_positions():
    ls = split_logits(builtin("alibi").hooks["logits_transform"], reassociate=True)
    assert not _loads_of(ls.score, "alibi_slopes")
    assert ls.float_positions and str(ls.score.body.value) == "s * rt[0] + (kv_pos_f * rt[1] + rt[2])"
    assert [str(t) for t in ls.terms[:2]] == ["scale * post", "alibi_slopes[qo_head] * post"]


def test_float_positions_only_where_exact():
    """kv_pos +- qo_pos and small constants: rewritten; an int parameter (of any size) in the sum, or a
    read of kv_pos other than the conversion: kept as the int conversion."""
    assert split_logits(_within_window, reassociate=True).float_positions
    assert not split_logits(offset_bias, reassociate=True).float_positions
    assert not split_logits(head_table_bias, reassociate=True).float_positions  # table[qo_head, kv_pos % 64]
    assert not split_logits(builtin("alibi").hooks["logits_transform"], reassociate=False).float_positions




def test_affine_hooks_keep_a_canonical_form():
    """ALiBi and a linear distance bias: rt[0] * s + (rt[1] * kv_pos_f + rt[2]), their terms in that order
    (the templates' interior fast path reads them by position); a tanh, a table read by key or an int
    offset parameter in the position: not affine."""
    alibi = split_logits(builtin("alibi").hooks["logits_transform"], reassociate=True)
    assert alibi.affine and alibi.affine_kv and alibi.n_terms == 3
    assert str(alibi.terms[0]) == "scale * post"
    window = split_logits(_within_window, reassociate=True)  # s - 0.01 * (qo_pos - kv_pos + 7)
    assert window.affine and window.affine_kv and str(window.terms[1]) == "T.float32(0.01) * post"
    for func in (builtin("logits_softcap").hooks["logits_transform"], head_table_bias, offset_bias, guarded_read):
        assert not split_logits(func, reassociate=True).affine
    # precise hook math keeps the hook's own operations: no canonical form
    assert not split_logits(builtin("alibi").hooks["logits_transform"], reassociate=False).affine


def test_affine_hook_without_a_key_term():
    ls = split_logits(_head_scale, reassociate=True)
    assert ls.affine and not ls.affine_kv and str(ls.score.body.value) == "s * rt[0] + rt[2]"
    assert str(ls.terms[1]) == "T.float32(0.0)"
    assert "T.float32(-1.0)" in str(ls.terms[2])


def test_traits_flag_the_affine_path_for_softmax_variants_only():
    """kLogitsAffine (csrc/score_rules.cuh's interior path) for an affine hook of a softmax variant; not for a
    'sum' state variant with the same hook (no running max to fold into), nor for soft-cap."""
    from attngen.codegen.cuda_variant import traits_parts

    def flags(v):
        return traits_parts(v, lower_hooks_cuda(v, 128, "sm_90a"), 128)[0]

    alibi = builtin("alibi")
    assert flags(alibi)["kLogitsAffine"] == "true" and flags(alibi)["kLogitsAffineKv"] == "true"
    head_scale = Variant("head_scale", logits_transform=_head_scale, params=[TensorParam("w", "float32", (8,))])
    assert flags(head_scale)["kLogitsAffine"] == "true" and flags(head_scale)["kLogitsAffineKv"] == "false"
    summed = Variant("alibi_sum", logits_transform=alibi.hooks["logits_transform"], state="sum",
                     params=list(alibi.params))
    assert flags(summed)["kLogitsAffine"] == "false"
    assert flags(builtin("logits_softcap"))["kLogitsAffine"] == "false"
    assert flags(builtin("vanilla"))["kLogitsAffine"] == "false"


def test_post_scaled_hooks():
    """g * rt[k] with rt[k] read nowhere in g: soft-cap (rt[1], its cap times log2 e), a hook whose factor also
    appears inside the tanh (the outer one takes post in: a term of its own), a guarded read scaled by post; not an
    affine hook, a difference, or precise math. (test_the_pair_computes_the_scaled_hook checks g * rt[k] against
    the hook wherever post_scale is set.)"""
    softcap = split_logits(builtin("logits_softcap").hooks["logits_transform"], reassociate=True)
    assert softcap.post_scale == 1 and str(softcap.score.body.value) == "T.tanh(s * rt[0]) * rt[1]"
    assert split_logits(builtin("logits_softcap").hooks["logits_transform"], reassociate=False).post_scale == -1
    # w[qo_head] inside and outside the tanh: the outer one takes post in, a term of its own that g does not read
    shared = split_logits(_shared_term, reassociate=True)
    assert shared.post_scale == 2 and str(shared.score.body.value) == "T.tanh(s * rt[0] + rt[1]) * rt[2]"
    guarded = split_logits(guarded_read, reassociate=True)  # (s * scale + a guarded read) * post
    assert guarded.post_scale == 1 and str(guarded.terms[1]) == "post"
    # a tanh times the factor bounds every logit by it (the Hopper template's fixed row max)
    assert softcap.post_bounded and shared.post_bounded and not guarded.post_bounded
    for func in (builtin("alibi").hooks["logits_transform"], head_table_bias, _head_scale):
        assert split_logits(func, reassociate=True).post_scale == -1


def test_traits_flag_the_post_scaled_path_for_softmax_variants_only():
    from attngen.codegen.cuda_variant import traits_parts
    from attngen.codegen.lto import record_abi

    def flags(v, math="approx"):
        return traits_parts(v, lower_hooks_cuda(v, 128, "sm_90a", math=math), 128)[0]

    softcap = builtin("logits_softcap")
    assert flags(softcap)["kLogitsPostScale"] == "1" and flags(softcap)["kLogitsPostBounded"] == "true"
    assert flags(softcap, "precise")["kLogitsPostBounded"] == "false"
    assert flags(softcap, "precise")["kLogitsPostScale"] == "-1"
    summed = Variant("softcap_sum", logits_transform=softcap.hooks["logits_transform"], state="sum",
                     params=list(softcap.params))
    assert flags(summed)["kLogitsPostScale"] == "-1"
    assert flags(builtin("alibi"))["kLogitsPostScale"] == "-1" and flags(builtin("vanilla"))["kLogitsPostScale"] == "-1"
    # decode objects compile with the prefill-only flags neutral, so that soft-cap's share one with its like
    abi = "  static constexpr int kLogitsPostScale = 1;\n  static constexpr int kScoreSfuCalls = 1;\n"
    assert record_abi("decode", abi) == ("  static constexpr int kLogitsPostScale = -1;\n"
                                         "  static constexpr int kScoreSfuCalls = 0;\n")
    assert record_abi("prefill", abi) == abi


@pytest.mark.parametrize("hook", [score_in_select, score_in_branch], ids=["select", "if_then_else"])
@pytest.mark.parametrize("math", ["approx", "precise"])
def test_a_score_under_a_condition_lowers_to_cuda(hook, math):
    """The score inside a select's values or a branch keeps s * scale there; the scale then comes from a term
    (the score function has no scale of its own, which TVM's CUDA generator refused as an undefined variable)."""
    hs = lower_hooks_cuda(Variant("score_under_condition", logits_transform=hook), 64, "sm_80", math)
    split = hs.logits_split["split"]
    assert {"scale", "post"} <= {str(t) for t in split.terms}
    assert "scale" not in {v.name for v in tu.used_vars(split.score.body)}
