"""fp8 KV caches on the CPU backend: builds, symbols, argument checks and numerics.

The kernels read ``float8_e4m3fn`` / ``float8_e5m2`` keys and values with per-KV-head scales and
must match the float64 reference on the dequantised values (``reference_attention(...,
k_scale=, v_scale=)``): ragged and paged (both layouts) prefill and decode, GQA, every branch of
the kernel (a key hook, a score hook without the log2(e) fold, the sum state, an output hook),
float32, float16 and bfloat16 queries (bfloat16 as torch tensors: NumPy has no DLPack bfloat16), and
caches holding the formats' largest values.
"""
import ml_dtypes
import numpy as np
import pytest
import torch

from attngen.ir import ConfigError
from attngen.runtime import AttentionArgumentError, CPUAttention, PagedKV, RaggedKV, reference_attention
from attngen.runtime.fp8 import FP8_FORMATS, kv_scale_for, quantize_kv
from attngen.runtime.reference import gather_pages
from attngen.schedules.build_config import BuildConfig, symbol
from attngen.testing import FLOORS, random_params, random_problem, rounding_error
from attngen.variants import builtin

HEAD_DIM = 32
FORMATS = list(FP8_FORMATS)
PAIRS = [(q, kv) for q in ("float32", "float16", "bfloat16") for kv in FORMATS]
# Which (query dtype, fp8 format) pairs each variant's numerics test runs: "causal" (the plain kernel, and the
# library the other tests use) every pair; each hook variant two pairs, one per format, so that over the hook
# variants every pair appears (the fp8 decoding does not depend on the hooks, the hooks not on the pair; a CPU
# library costs seconds per pair).
HOOK_VARIANT_PAIRS = {"logits_softcap": [PAIRS[0], PAIRS[5]], "rope": [PAIRS[2], PAIRS[1]],
                      "sigmoid": [PAIRS[4], PAIRS[3]], "attention_sink": [PAIRS[0], PAIRS[3]]}
VARIANT_PAIRS = {"causal": PAIRS, **HOOK_VARIANT_PAIRS}
_modules = {}


def fp8_module(name, build_cache):
    """``name``'s CPU library for its (query dtype, fp8 format) pairs of ``VARIANT_PAIRS``."""
    if name not in _modules:
        v = builtin(name)
        pairs = VARIANT_PAIRS[name]
        _modules[name] = (v, CPUAttention.build(v, head_dims=(HEAD_DIM,), dtypes=[q for q, _ in pairs],
                                                kv_dtypes=[kv for _, kv in pairs], cache=build_cache))
    return _modules[name]


def quantised_problem(rng, kv_dtype, q_dtype, *, qo_lens, kv_lens, num_qo_heads, num_kv_heads, layout,
                      page_size=4, spread=1.0, head_dim=HEAD_DIM, per_tensor=False):
    """A random problem whose ragged and paged K/V are stored as ``kv_dtype`` with per-head scales
    (from each head's largest value, times random factors so that rows are not all in range), or with one
    scale (a float: the largest head's) for the whole cache where ``per_tensor``."""
    prob = random_problem(rng, qo_lens, kv_lens, num_qo_heads, num_kv_heads, head_dim, page_size=page_size,
                          dtype="float32", layout="NHD")
    k_scale = kv_scale_for(prob.paged.pages[:, 0].reshape(-1, num_kv_heads, head_dim), kv_dtype) * spread
    v_scale = kv_scale_for(prob.paged.pages[:, 1].reshape(-1, num_kv_heads, head_dim), kv_dtype) * spread
    if per_tensor:
        k_scale, v_scale = float(k_scale.max()), float(v_scale.max())
    pages = np.stack([quantize_kv(prob.paged.pages[:, 0], kv_dtype, k_scale),
                      quantize_kv(prob.paged.pages[:, 1], kv_dtype, v_scale)], axis=1)
    if layout == "HND":
        pages = np.ascontiguousarray(pages.transpose(0, 1, 3, 2, 4))
    paged = PagedKV(pages, prob.paged.indptr, prob.paged.indices, prob.paged.last_page_len, layout)
    ragged = RaggedKV(quantize_kv(prob.ragged.k, kv_dtype, k_scale), quantize_kv(prob.ragged.v, kv_dtype, v_scale),
                      prob.ragged.indptr)
    keys, values = gather_pages(pages, paged.indptr, paged.indices, paged.last_page_len, layout)
    prob.q, prob.paged, prob.ragged, prob.keys, prob.values = rounded(prob.q, q_dtype), paged, ragged, keys, values
    return prob, k_scale, v_scale


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype`` (bfloat16 through torch), as a float32 array when NumPy lacks the dtype."""
    if dtype == "bfloat16":
        return torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    return x.astype(dtype)


def as_call_tensor(x: np.ndarray, dtype: str):
    """What a call takes for queries / outputs of ``dtype``: a torch tensor for bfloat16, else ``x``."""
    return torch.from_numpy(x).to(torch.bfloat16) if dtype == "bfloat16" else x


def tolerance(ref_out, q_dtype):
    """The kernels compute in float32 on exactly decoded values: the float32 arithmetic and the rounding of
    the output to the query dtype are the only errors."""
    return 8 * rounding_error(ref_out, q_dtype) + FLOORS[q_dtype] * max(1.0, float(np.abs(ref_out).max()))


def run_and_compare(att, v, rng, prob, k_scale, v_scale, q_dtype, kv, *, decode=False):
    """Run one call on NaN-poisoned outputs; the max |O - ref| and |lse - ref| after asserting them."""
    q, qo_indptr = prob.q, prob.qo_indptr
    head_dim = q.shape[2]
    if decode:
        q = rounded(rng.standard_normal((len(prob.kv_lens), q.shape[1], head_dim)).astype(np.float32), q_dtype)
        qo_indptr = np.arange(len(prob.kv_lens) + 1, dtype=np.int32)
    params = random_params(v, rng, prob)
    sm_scale = 1.0 / np.sqrt(head_dim)
    ref_o, ref_l = reference_attention(v, q, prob.keys, prob.values, qo_indptr, sm_scale, params,
                                       k_scale=k_scale, v_scale=v_scale)
    out = as_call_tensor(np.full(q.shape, np.nan, np.float32 if q_dtype == "bfloat16" else q_dtype), q_dtype)
    lse = as_call_tensor(np.full(q.shape[:2], np.nan, np.float32), "float32")
    q_in = as_call_tensor(q, q_dtype)
    if decode:
        att.decode(q_in, kv, sm_scale=sm_scale, params=params, out=out, lse=lse, k_scale=k_scale, v_scale=v_scale)
    else:
        att.prefill(q_in, kv, qo_indptr, sm_scale=sm_scale, params=params, out=out, lse=lse, k_scale=k_scale,
                    v_scale=v_scale)
    out = out.float().numpy() if q_dtype == "bfloat16" else out
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    err = float(np.abs(out.astype(np.float64) - ref_o).max())
    empty = np.isneginf(ref_l)
    assert np.array_equal(np.isneginf(lse), empty)
    lse_err = float(np.abs(np.where(empty, 0.0, lse.astype(np.float64) - np.where(empty, 0.0, ref_l))).max())
    assert err <= tolerance(ref_o, q_dtype), (err, tolerance(ref_o, q_dtype))
    assert lse_err <= (1e-4 if q_dtype == "float32" else 2e-2), lse_err
    return err, lse_err


def test_the_hook_variants_cover_every_pair_and_format():
    assert {pair for pairs in HOOK_VARIANT_PAIRS.values() for pair in pairs} == set(PAIRS)
    assert all({kv for _, kv in pairs} == set(FORMATS) for pairs in HOOK_VARIANT_PAIRS.values())


@pytest.mark.parametrize("name,q_dtype,kv_dtype", [(name, q, kv) for name, pairs in VARIANT_PAIRS.items()
                                                   for q, kv in pairs])
def test_fp8_cache_matches_the_reference_on_dequantised_values(name, q_dtype, kv_dtype, build_cache, rng):
    v, att = fp8_module(name, build_cache)
    for layout, group in (("NHD", 4), ("HND", 1)):
        num_kv = 2
        prob, k_scale, v_scale = quantised_problem(rng, kv_dtype, q_dtype, qo_lens=[3, 0, 6, 2], kv_lens=[9, 5, 6, 0],
                                                   num_qo_heads=num_kv * group, num_kv_heads=num_kv, layout=layout)
        run_and_compare(att, v, rng, prob, k_scale, v_scale, q_dtype, prob.paged)
        run_and_compare(att, v, rng, prob, k_scale, v_scale, q_dtype, prob.paged, decode=True)
        if layout == "NHD":
            run_and_compare(att, v, rng, prob, k_scale, v_scale, q_dtype, prob.ragged)


@pytest.mark.parametrize("kv_dtype", FORMATS)
def test_head_dim_128_long_requests_and_pages_of_16(kv_dtype, build_cache, rng):
    v = builtin("sliding_window_causal")
    att = CPUAttention.build(v, head_dims=(128,), dtypes=("float32",), kv_dtypes=(kv_dtype,), layouts=("HND",),
                             cache=build_cache)
    prob, k_scale, v_scale = quantised_problem(rng, kv_dtype, "float32", qo_lens=[17, 1], kv_lens=[300, 33],
                                               num_qo_heads=8, num_kv_heads=2, layout="HND", page_size=16,
                                               head_dim=128)
    run_and_compare(att, v, rng, prob, k_scale, v_scale, "float32", prob.paged)
    run_and_compare(att, v, rng, prob, k_scale, v_scale, "float32", prob.paged, decode=True)


@pytest.mark.parametrize("kv_dtype", FORMATS)
def test_largest_values_and_scalar_scales(kv_dtype, build_cache, rng):
    """Caches full of the format's largest finite values (e4m3 has no inf: 448), one scale for all heads."""
    v, att = fp8_module("causal", build_cache)
    prob, _, _ = quantised_problem(rng, kv_dtype, "float32", qo_lens=[2, 5], kv_lens=[7, 12], num_qo_heads=4,
                                   num_kv_heads=2, layout="NHD", spread=0.25)  # most values saturate
    limit = FP8_FORMATS[kv_dtype].max_finite
    assert max(float(np.abs(k.astype(np.float64)).max()) for k in prob.keys) == limit
    scale = 1.0 / limit  # keys of norm up to sqrt(D): scores stay finite in float32
    run_and_compare(att, v, rng, prob, scale, 2.0, "float32", prob.paged)
    run_and_compare(att, v, rng, prob, scale, 2.0, "float32", prob.ragged)
    run_and_compare(att, v, rng, prob, scale, 2.0, "float32", prob.paged, decode=True)


def test_torch_fp8_tensors_and_tensor_scales(build_cache, rng):
    v, att = fp8_module("causal", build_cache)
    prob, k_scale, v_scale = quantised_problem(rng, "float8_e4m3fn", "float16", qo_lens=[4, 1], kv_lens=[6, 9],
                                               num_qo_heads=4, num_kv_heads=2, layout="NHD")
    pages = torch.from_numpy(prob.paged.pages.view(np.uint8)).view(torch.float8_e4m3fn)
    paged = PagedKV(pages, *(torch.from_numpy(x) for x in (prob.paged.indptr, prob.paged.indices,
                                                            prob.paged.last_page_len)))
    q = torch.from_numpy(prob.q)
    out, lse = att.prefill(q, paged, torch.from_numpy(prob.qo_indptr), k_scale=torch.from_numpy(k_scale),
                           v_scale=torch.tensor(float(v_scale[0])))
    ref_o, _ = reference_attention(v, prob.q, prob.keys, prob.values, prob.qo_indptr, 1 / np.sqrt(HEAD_DIM),
                                   k_scale=k_scale, v_scale=float(v_scale[0]))
    assert out.dtype == torch.float16
    assert float(np.abs(out.double().numpy() - ref_o).max()) <= tolerance(ref_o, "float16")


def test_call_errors_name_the_fix(build_cache, rng):
    v, att = fp8_module("causal", build_cache)
    prob, k_scale, v_scale = quantised_problem(rng, "float8_e5m2", "float32", qo_lens=[2], kv_lens=[5],
                                               num_qo_heads=2, num_kv_heads=2, layout="NHD")
    with pytest.raises(AttentionArgumentError, match=r"k_scale: the KV cache is fp8 \(float8_e5m2\) and needs "
                                                     r"k_scale: pass k_scale= with a float, or a float32 tensor"):
        att.decode(prob.q[:1], prob.paged)
    with pytest.raises(AttentionArgumentError, match=r"v_scale: .* needs v_scale"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr, k_scale=1.0)
    bits = PagedKV(prob.paged.pages.view(np.uint8), prob.paged.indptr, prob.paged.indices, prob.paged.last_page_len)
    with pytest.raises(AttentionArgumentError, match="kv.pages: expected dtype float32, got uint8"):
        att.prefill(prob.q, bits, prob.qo_indptr, k_scale=1.0, v_scale=1.0)
    plain = random_problem(rng, [2], [5], 2, 2, HEAD_DIM)
    with pytest.raises(AttentionArgumentError, match="k_scale/v_scale: the KV cache is float32, not fp8"):
        att.prefill(plain.q, plain.ragged, plain.qo_indptr, k_scale=0.5, v_scale=0.5)
    with pytest.raises(AttentionArgumentError, match=r"v_scale: shape \(3,\); expected \[\] or \[1\] \(one scale\) or "
                                                     r"\[num_kv_heads=2\]"):
        att.decode(prob.q[:1], prob.paged, k_scale=k_scale, v_scale=np.ones(3, np.float32))
    mixed = RaggedKV(prob.ragged.k, prob.ragged.v.astype(np.float32), prob.ragged.indptr)
    with pytest.raises(AttentionArgumentError, match="kv.v: expected dtype float8_e5m2, got float32"):
        att.prefill(prob.q, mixed, prob.qo_indptr, k_scale=1.0, v_scale=1.0)
    with pytest.raises(AttentionArgumentError, match="q: dtype float8_e5m2: fp8 is a K/V cache format"):
        att.prefill(prob.q.astype(ml_dtypes.float8_e5m2), prob.ragged, prob.qo_indptr, k_scale=1.0, v_scale=1.0)


def test_a_library_without_the_fp8_functions_says_how_to_rebuild(build_cache, rng):
    v = builtin("vanilla")
    att = CPUAttention.build(v, head_dims=(HEAD_DIM,), layouts=("NHD",), cache=build_cache)
    prob, k_scale, v_scale = quantised_problem(rng, "float8_e4m3fn", "float32", qo_lens=[2], kv_lens=[5],
                                               num_qo_heads=2, num_kv_heads=2, layout="NHD")
    with pytest.raises(AttentionArgumentError, match=r"has no batch_decode_paged_nhd_f32_kve4m3_d32: .* rebuild with "
                                                     r"dtypes including float32 paired with kv_dtypes float8_e4m3fn"):
        att.decode(prob.q[:1], prob.paged, k_scale=k_scale, v_scale=v_scale)


def test_build_config_and_symbols():
    cfg = BuildConfig("cpu", (64,), ("float16", "float32"), kv_dtypes=("float8_e4m3fn", "float8_e5m2"))
    assert [p.short for p in cfg.dtype_pairs] == ["f16_kve4m3", "f32_kve5m2"]
    assert [p.kv_scaled for p in cfg.dtype_pairs] == [True, True]
    assert symbol("batch_decode_paged_nhd", "float16", 64, "float8_e4m3fn") == "batch_decode_paged_nhd_f16_kve4m3_d64"
    with pytest.raises(ConfigError, match="dtype float8_e4m3fn is a K/V cache storage format, not a query/output "
                                          "dtype; keep the query dtype in dtypes and give float8_e4m3fn in kv_dtypes"):
        BuildConfig("cpu", (64,), ("float8_e4m3fn",))
    with pytest.raises(ConfigError, match=r"kv_dtypes: fp8 K/V \(float8_e5m2\) on cuda are read by the decode and "
                                          r"prefill templates only"):
        BuildConfig("cuda", (128,), ("float16",), ("sm_90a",), kernels=("tvm",), kv_dtypes=("float8_e5m2",))
    with pytest.raises(ConfigError, match=r"K/V dtype int8 with query dtype float16 is not supported; the cpu "
                                          r"kernels read K/V in the query dtype \(kv_dtypes=\(\) or equal to dtypes\) "
                                          r"or in fp8"):
        BuildConfig("cpu", (64,), ("float16",), kv_dtypes=("int8",))


def test_ml_dtypes_and_torch_name_the_formats_alike():
    for dtype in FORMATS:
        assert str(np.zeros(1, getattr(ml_dtypes, dtype)).dtype) == dtype
        assert str(getattr(torch, dtype)).replace("torch.", "") == dtype


def test_cli_builds_fp8_functions_and_refuses_fp8_tvm_slots_on_cuda(tmp_path, capsys):
    from attngen.cli import main

    assert main(["build", "vanilla", "--head-dim", "32", "--layout", "HND", "--dtype", "float16",
                 "--kv-dtype", "float8_e5m2", "--cache-dir", str(tmp_path / "c")]) == 0
    text = capsys.readouterr().out
    assert "dtype ['float16'], kv_dtype ['float8_e5m2']" in text
    assert "function batch_decode_paged_hnd_f16_kve5m2_d32" in text
    assert main(["build", "vanilla", "--target", "cuda", "--arch", "sm_90a", "--kv-dtype", "float8_e4m3fn",
                 "--kernels", "decode,tvm"]) == 2
    assert "fp8 K/V (float8_e4m3fn) on cuda are read by the decode and prefill templates only" in \
        capsys.readouterr().err


@pytest.mark.parametrize("name", ["causal", "rope"])
def test_bfloat16_queries_with_a_bfloat16_cache(name, build_cache, rng):
    """bfloat16 is a CPU query dtype of its own (the fp8 caches' bfloat16 queries use it): K/V in bfloat16 too."""
    v = builtin(name)
    att = CPUAttention.build(v, head_dims=(HEAD_DIM,), dtypes=("bfloat16",), layouts=("NHD",), cache=build_cache)
    prob = random_problem(rng, [3, 5], [7, 5], 4, 2, HEAD_DIM)
    params = random_params(v, rng, prob)
    bf16 = {n: torch.from_numpy(x).to(torch.bfloat16) for n, x in (("q", prob.q), ("k", prob.ragged.k),
                                                                  ("v", prob.ragged.v), ("pages", prob.paged.pages))}
    index = {n: torch.from_numpy(x) for n, x in (("qo", prob.qo_indptr), ("kv", prob.ragged.indptr),
                                                 ("pi", prob.paged.indptr), ("ids", prob.paged.indices),
                                                 ("last", prob.paged.last_page_len))}
    kv = prob.ragged.indptr
    keys = [bf16["k"][kv[b]:kv[b + 1]].float().numpy() for b in range(2)]
    values = [bf16["v"][kv[b]:kv[b + 1]].float().numpy() for b in range(2)]
    paged = PagedKV(bf16["pages"], index["pi"], index["ids"], index["last"])
    dec_q = bf16["q"][:2].contiguous()
    runs = [(att.prefill(bf16["q"], RaggedKV(bf16["k"], bf16["v"], index["kv"]), index["qo"], params=params),
             bf16["q"], prob.qo_indptr),
            (att.prefill(bf16["q"], paged, index["qo"], params=params), bf16["q"], prob.qo_indptr),
            (att.decode(dec_q, paged, params=params), dec_q, np.arange(3, dtype=np.int32))]
    for (out, lse), q, qo_indptr in runs:
        ref_o, ref_l = reference_attention(v, q.float().numpy(), keys, values, qo_indptr, HEAD_DIM ** -0.5, params)
        assert out.dtype == torch.bfloat16
        assert float(np.abs(out.double().numpy() - ref_o).max()) <= tolerance(ref_o, "bfloat16")
        assert float(np.abs(lse.double().numpy() - ref_l).max()) <= 2e-2
