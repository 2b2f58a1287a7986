"""Scalar parameters compiled in as constants (Variant.with_constants, `--constant`): the hooks hold the
value, the parameter leaves the call, the results match passing the value, and bad folds are refused."""
import subprocess
import sys

import numpy as np
import pytest

from attngen.codegen.hooks_cuda import lower_hooks_cuda
from attngen.ir import VariantError
from attngen.runtime import AttentionArgumentError, CPUAttention, RaggedKV
from attngen.testing import random_problem
from attngen.variants import builtin


def test_folded_parameter_leaves_the_call_and_enters_the_ir():
    v = builtin("logits_softcap")
    f = v.with_constants(soft_cap=30.0)
    assert [p.name for p in f.params] == [] and f.constants == {"soft_cap": 30.0}
    assert "30.0" in f.hooks["logits_transform"].script() and "soft_cap" not in f.hooks["logits_transform"].script()
    assert f.ir_text() != v.ir_text() != v.with_constants(soft_cap=31.0).ir_text()
    # the CUDA hook takes no parameter block entry for it: the constant is in the code
    src = lower_hooks_cuda(f, 128, "sm_80").code
    assert "soft_cap" not in src and "0x1.ep+4f" in src


def test_folded_window_is_a_static_bound():
    w = builtin("sliding_window_causal").with_constants(window_left=3)
    assert "qo_pos - kv_pos <= 3" in w.analysis.mask.describe()


def test_folded_results_match_passing_the_value(build_cache):
    rng = np.random.default_rng(0)
    v = builtin("logits_softcap")
    prob = random_problem(rng, [5, 0, 9], [12, 3, 9], 4, 2, 32, page_size=4)
    kv = RaggedKV(prob.ragged.k, prob.ragged.v, prob.ragged.indptr)
    att = CPUAttention.build(v, head_dims=(32,), cache=build_cache)
    folded = CPUAttention.build(v.with_constants(soft_cap=2.0), head_dims=(32,), cache=build_cache)
    out, lse = att.prefill(prob.q, kv, prob.qo_indptr, params={"soft_cap": 2.0})
    out_f, lse_f = folded.prefill(prob.q, kv, prob.qo_indptr)
    np.testing.assert_allclose(out_f, out, atol=1e-6)
    np.testing.assert_allclose(lse_f, lse, atol=1e-6)
    with pytest.raises(AttentionArgumentError, match="soft_cap"):
        folded.prefill(prob.q, kv, prob.qo_indptr, params={"soft_cap": 2.0})


@pytest.mark.parametrize("name,values,message", [
    ("alibi", {"alibi_slopes": 1.0}, "is a tensor parameter"),
    ("logits_softcap", {"cap": 1.0}, "is not a parameter"),
    ("sliding_window_causal", {"window_left": 2**31}, "outside int32's range"),
    ("sliding_window_causal", {"window_left": 2.5}, "not a whole number"),
])
def test_bad_folds_are_refused(name, values, message):
    with pytest.raises(VariantError, match=message):
        builtin(name).with_constants(**values)


def test_cli_inspect_shows_the_folded_constant():
    p = subprocess.run([sys.executable, "-m", "attngen.cli", "inspect", "logits_softcap", "--constant", "soft_cap=30"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "soft_cap = 30.0: compiled in" in p.stdout
    bad = subprocess.run([sys.executable, "-m", "attngen.cli", "inspect", "logits_softcap", "--constant", "soft_cap"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "expected name=number" in bad.stderr
