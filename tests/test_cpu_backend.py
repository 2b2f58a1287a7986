"""Every built-in variant on the CPU backend against the float64 reference.

Ragged batches with a zero-length request and a request with no keys, random page
permutations with spare pages, both paged layouts, GQA ratios 1, 4 and 7, outputs
poisoned with NaN before each run.
"""
import numpy as np
import pytest

from attngen.runtime import CPUAttention
from attngen.testing import check_cpu_variant
from attngen.variants import BUILTINS, builtin

HEAD_DIM = 32
_modules = {}


def cpu_module(name, build_cache, dtypes=("float32",), head_dim=HEAD_DIM):
    key = (name, dtypes, head_dim)
    if key not in _modules:
        v = builtin(name)
        _modules[key] = (v, CPUAttention.build(v, head_dims=(head_dim,), dtypes=dtypes, cache=build_cache))
    return _modules[key]


@pytest.mark.parametrize("group", [1, 4, 7])
@pytest.mark.parametrize("name", list(BUILTINS))
def test_builtin_variant_matches_reference(name, group, build_cache, rng):
    v, att = cpu_module(name, build_cache)
    num_kv = 2 if group != 7 else 1
    results = check_cpu_variant(att, v, rng, qo_lens=[3, 0, 6, 2, 1], kv_lens=[9, 5, 6, 0, 13],
                                num_qo_heads=num_kv * group, num_kv_heads=num_kv, head_dim=HEAD_DIM)
    assert set(results) == {"prefill_ragged", "prefill_paged_NHD", "prefill_paged_HND",
                            "decode_paged_NHD", "decode_paged_HND"}


@pytest.mark.parametrize("name", ["vanilla", "rope", "sigmoid", "attention_sink"])
def test_float16_inputs(name, build_cache, rng):
    v, att = cpu_module(name, build_cache, dtypes=("float16",))
    check_cpu_variant(att, v, rng, qo_lens=[4, 0, 7], kv_lens=[11, 3, 7], num_qo_heads=4, num_kv_heads=1,
                      head_dim=HEAD_DIM, dtype="float16", layouts=("NHD",))


def test_head_dim_128_and_page_size_16(build_cache, rng):
    v, att = cpu_module("sliding_window_causal", build_cache, head_dim=128)
    check_cpu_variant(att, v, rng, qo_lens=[17, 1], kv_lens=[40, 33], num_qo_heads=8, num_kv_heads=2,
                      head_dim=128, page_size=16, layouts=("HND",))


def test_empty_rows_are_zero_with_neg_inf_lse(build_cache):
    v, att = cpu_module("causal", build_cache)
    q = np.ones((3, 2, HEAD_DIM), np.float32)
    from attngen.runtime import RaggedKV
    k = np.ones((0, 2, HEAD_DIM), np.float32)
    out = np.full_like(q, np.nan)
    lse = np.full((3, 2), np.nan, np.float32)
    att.prefill(q, RaggedKV(k, k.copy(), np.array([0, 0], np.int32)), np.array([0, 3], np.int32),
                out=out, lse=lse)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_torch_tensors_in_and_out(build_cache, rng):
    import torch
    from attngen.runtime import RaggedKV, reference_attention

    v, att = cpu_module("vanilla", build_cache)
    q = torch.randn(5, 4, HEAD_DIM)
    k = torch.randn(7, 2, HEAD_DIM)
    val = torch.randn(7, 2, HEAD_DIM)
    qo = torch.tensor([0, 2, 5], dtype=torch.int32)
    kv = torch.tensor([0, 3, 7], dtype=torch.int32)
    out, lse = att.prefill(q, RaggedKV(k, val, kv), qo)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    ro, rl = reference_attention(v, q.numpy(), [k[:3].numpy(), k[3:].numpy()], [val[:3].numpy(), val[3:].numpy()],
                                 qo.numpy(), 1 / np.sqrt(HEAD_DIM))
    assert np.abs(out.numpy() - ro).max() < 1e-5 and np.abs(lse.numpy() - rl).max() < 1e-4


def test_sm_scale_and_params_are_honoured(build_cache, rng):
    from attngen.testing import random_problem
    from attngen.runtime import reference_attention

    v, att = cpu_module("logits_softcap", build_cache)
    p = random_problem(rng, [4], [9], 4, 2, HEAD_DIM)
    outs = []
    for scale, cap in [(0.5, 2.0), (0.5, 50.0), (0.05, 2.0)]:
        o, lse = att.prefill(p.q, p.ragged, p.qo_indptr, sm_scale=scale, params={"soft_cap": cap})
        ro, _ = reference_attention(v, p.q, p.keys, p.values, p.qo_indptr, scale, {"soft_cap": cap})
        assert np.abs(o - ro).max() < 1e-5
        outs.append(o)
    assert np.abs(outs[0] - outs[1]).max() > 1e-3 and np.abs(outs[0] - outs[2]).max() > 1e-3


def test_whole_row_hooks(build_cache, rng):
    from attngen.codegen.hooks_cuda import lower_hooks_cuda

    from .row_hook_variants import make

    v = make()
    assert lower_hooks_cuda(v, 32, "sm_80").elementwise == {}  # none of these is per-element
    att = CPUAttention.build(v, head_dims=(HEAD_DIM,), cache=build_cache)
    check_cpu_variant(att, v, rng, qo_lens=[3, 0, 4], kv_lens=[6, 2, 9], num_qo_heads=4, num_kv_heads=2,
                      head_dim=HEAD_DIM)


def test_empty_batch(build_cache):
    from attngen.runtime import PagedKV, RaggedKV

    v, att = cpu_module("causal", build_cache)
    q = np.zeros((0, 4, HEAD_DIM), np.float32)
    k = np.zeros((0, 2, HEAD_DIM), np.float32)
    out, lse = att.prefill(q, RaggedKV(k, k.copy(), np.array([0], np.int32)), np.array([0], np.int32))
    assert out.shape == (0, 4, HEAD_DIM) and lse.shape == (0, 4)
    pages = np.zeros((2, 2, 4, 2, HEAD_DIM), np.float32)
    kv = PagedKV(pages, np.array([0], np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32))
    out, lse = att.decode(q, kv)
    assert out.shape == (0, 4, HEAD_DIM)


def test_cpu_program_calls_every_hook_kind():
    """A hook kind in the contract table that the CPU template never calls would be silently ignored."""
    from attngen.codegen.cpu.attention_tir import attention_program
    from attngen.codegen.cpu.program_spec import CPUKernelSpec
    from attngen.codegen.cpu.inline_hooks import PLACEHOLDER
    from attngen.ir import HOOKS

    text = attention_program(CPUKernelSpec("paged", False, HEAD_DIM, "float32", transform_keys=True)).script()
    assert [h for h in HOOKS if PLACEHOLDER + h not in text] == []
