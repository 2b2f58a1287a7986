"""Queries, keys and values that are views of one fused QKV projection ([tokens, (Hq + 2 Hkv) * D], split without
a copy), as serving runtimes hand them over: the CPU backend reads them and any other layout (packing them itself)
with the results of contiguous copies; what the CUDA kernels cannot read in place is refused by name by the
checks the CUDA backend runs (runtime/checks.py check_tensor's ``strided``; the kernels reading the views:
tests/test_gpu_strided_inputs.py)."""
import numpy as np
import pytest

from attngen.runtime import CPUAttention, PagedKV, RaggedKV
from attngen.runtime.checks import AttentionArgumentError, check_ragged, check_tensor
from attngen.variants import builtin

D, HQ, HKV = 32, 4, 2
_modules = {}


def cpu_module(name, build_cache):
    if name not in _modules:
        _modules[name] = CPUAttention.build(builtin(name), head_dims=(D,), dtypes=("float32",), cache=build_cache)
    return _modules[name]


def fused_qkv(rng, tokens, lib="numpy"):
    """q [tokens, HQ, D], k, v [tokens, HKV, D]: views of one [tokens, (HQ + 2 HKV) * D] array."""
    qkv = rng.standard_normal((tokens, (HQ + 2 * HKV) * D)).astype(np.float32)
    if lib == "torch":
        import torch

        qkv = torch.from_numpy(qkv)
    q = qkv[:, :HQ * D].reshape(tokens, HQ, D)
    k = qkv[:, HQ * D:(HQ + HKV) * D].reshape(tokens, HKV, D)
    v = qkv[:, (HQ + HKV) * D:].reshape(tokens, HKV, D)
    return q, k, v


def packed(x):
    return x.contiguous() if hasattr(x, "contiguous") else np.ascontiguousarray(x)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("name", ["causal", "rope"])
def test_ragged_prefill_reads_views_of_a_fused_projection(name, lib, build_cache, rng):
    att = cpu_module(name, build_cache)
    q, k, v = fused_qkv(rng, 23, lib)
    assert not (q.is_contiguous() if lib == "torch" else q.flags["C_CONTIGUOUS"])
    qo = np.array([0, 5, 5, 23], np.int32)
    kv_indptr = qo.copy()
    out, lse = att.prefill(q, RaggedKV(k, v, kv_indptr), qo)
    ref_o, ref_l = att.prefill(packed(q), RaggedKV(packed(k), packed(v), kv_indptr), qo)
    assert np.array_equal(np.asarray(out), np.asarray(ref_o)) and np.array_equal(np.asarray(lse), np.asarray(ref_l))


def test_decode_and_paged_prefill_read_strided_queries(build_cache, rng):
    att = cpu_module("causal", build_cache)
    q, _, _ = fused_qkv(rng, 3)
    pages = rng.standard_normal((6, 2, 4, HKV, D)).astype(np.float32)
    kv = PagedKV(pages, np.array([0, 2, 3, 6], np.int32), rng.permutation(6).astype(np.int32),
                 np.array([3, 4, 1], np.int32))
    out, lse = att.decode(q, kv)
    ref_o, ref_l = att.decode(packed(q), kv)
    assert np.array_equal(out, ref_o) and np.array_equal(lse, ref_l)
    qo = np.array([0, 1, 2, 3], np.int32)
    out, lse = att.prefill(q, kv, qo)
    ref_o, ref_l = att.prefill(packed(q), kv, qo)
    assert np.array_equal(out, ref_o) and np.array_equal(lse, ref_l)


def test_views_the_cuda_kernels_cannot_read_are_refused_by_name_and_packed_on_the_cpu(build_cache, rng):
    att = cpu_module("causal", build_cache)
    q, k, v = fused_qkv(rng, 8)
    qo = np.array([0, 8], np.int32)
    heads_apart = rng.standard_normal((8, HQ, 2 * D)).astype(np.float32)[:, :, :D]  # gaps between heads
    with pytest.raises(AttentionArgumentError, match=r"q: must be contiguous, or a view whose tokens' heads are "
                                                     r"packed.*strides \(256, 64, 1\)"):
        check_tensor(heads_apart, "q", 3, strided="tokens")
    every_other = rng.standard_normal((8, HKV, 2 * D)).astype(np.float32)[:, :, ::2]  # elements 2 apart
    with pytest.raises(AttentionArgumentError, match="kv.k: must be contiguous, or a view whose rows are contiguous"):
        check_ragged(RaggedKV(every_other, v, qo), D, "float32", 1)
    with pytest.raises(AttentionArgumentError, match=r"kv.k/kv.v: strides .* must match"):
        check_ragged(RaggedKV(k, packed(v), qo), D, "float32", 1)
    # the CPU backend packs any of them
    out, lse = att.prefill(heads_apart, RaggedKV(every_other, k, qo), qo)
    ref_o, ref_l = att.prefill(packed(heads_apart), RaggedKV(packed(every_other), packed(k), qo), qo)
    assert np.array_equal(out, ref_o) and np.array_equal(lse, ref_l)


def test_strides_along_dims_of_size_one_do_not_count():
    """Contiguous keys and values of one head (or one token) whose size-1 dims carry different strides match."""
    import torch

    k = torch.empty(5, 1, D)  # strides (D, D, 1)
    v = torch.empty(5, D, 1).transpose(1, 2)  # strides (D, 1, 1)
    assert k.is_contiguous() and v.is_contiguous() and k.stride() != v.stride()
    check_ragged(RaggedKV(k, v, np.array([0, 5], np.int32)), D, "float32", 1)
    with pytest.raises(AttentionArgumentError, match=r"kv.k/kv.v: shapes \(5, 1, 32\) / \(5, 2, 32\) must match"):
        check_ragged(RaggedKV(k, torch.empty(5, 2, D), np.array([0, 5], np.int32)), D, "float32", 1)


def test_strides_must_keep_rows_16_byte_aligned_and_apart():
    x = np.zeros((4, HQ * D + 2), np.float32)[:, :HQ * D].reshape(4, HQ, D)  # tokens 130 elements apart
    with pytest.raises(AttentionArgumentError, match="a multiple of 16 bytes apart"):
        check_tensor(x, "q", 3, strided="tokens")
    y = np.zeros((4, HQ * D + 4), np.float32)[:, :HQ * D].reshape(4, HQ, D)  # 132 floats: 528 bytes
    check_tensor(y, "q", 3, strided="tokens")
    overlapping = np.lib.stride_tricks.as_strided(np.zeros(64 * D, np.float32), (4, 2, D), (D * 4, 8 * 4, 4))
    with pytest.raises(AttentionArgumentError, match="without overlapping"):
        check_tensor(overlapping, "kv.k", 3, strided="rows")
    with pytest.raises(AttentionArgumentError, match="q: must be contiguous; strides"):
        check_tensor(y, "q", 3)  # (no strided form asked for)
