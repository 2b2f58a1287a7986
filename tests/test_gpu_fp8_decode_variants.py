"""The tensor-core decode over fp8 caches with hooks and group sizes beyond tests/test_fp8_cuda_build.py: a logits
hook (soft-cap), a non-softmax state (sigmoid), a mask with a parameter (sliding window), at head dims 64 and 128
(the half-MMA path that reads staged fp8 keys straight into fragments) and 256, with 1, 3 and 8 query heads per
KV head, against the float64 reference on the dequantised cache (``pytest -m gpu``)."""
import numpy as np
import pytest

from attngen.variants import builtin

PARAMS = {"logits_softcap": {"soft_cap": 7.0}, "sigmoid": {"sigmoid_bias": -1.0}, "sliding_window": {"window_left": 45}}
HEAD_DIMS = (64, 128, 256)


def _pages(rng, head_dim, num_pages, page_size, num_kv):
    """Random e4m3 pages [P, 2, S, Hkv, D] (NHD) with per-head scales: (pages, k_scale, v_scale)."""
    from attngen.runtime.fp8 import kv_scale_for, quantize_kv

    raw = rng.standard_normal((num_pages, 2, page_size, num_kv, head_dim)).astype(np.float32) * 3
    raw[:, :, :, 1] *= 0.05  # heads of different ranges: the scales differ per head
    k_scale = kv_scale_for(raw[:, 0].reshape(-1, num_kv, head_dim), "float8_e4m3fn")
    v_scale = kv_scale_for(raw[:, 1].reshape(-1, num_kv, head_dim), "float8_e4m3fn")
    pages = np.stack([quantize_kv(raw[:, 0], "float8_e4m3fn", k_scale),
                      quantize_kv(raw[:, 1], "float8_e4m3fn", v_scale)], 1)
    return pages, k_scale, v_scale


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PARAMS))
def test_fp8_tensor_core_decode_with_hooks_and_groups(name, build_cache, rng):
    import torch

    from attngen.runtime import CUDAAttention, PagedKV, reference_attention
    from attngen.runtime.reference import gather_pages
    from attngen.testing import check_decode_plans, fp8_tolerance

    variant, params = builtin(name), PARAMS[name]
    att = CUDAAttention.build(variant, head_dims=HEAD_DIMS, dtypes=("bfloat16",), kv_dtypes=("float8_e4m3fn",),
                              layouts=("NHD",), kernels=("decode",), cache=build_cache)
    page_size, num_kv = 16, 2
    kv_lens = [1, 37, 0, 300, 16, 129, 700]  # an empty request, odd lengths, a full last page, several tiles
    dev = torch.device("cuda")
    for d in HEAD_DIMS:
        for group in (1, 3, 8):
            n_pages = [-(-n // page_size) for n in kv_lens]
            total = sum(n_pages) + 3  # spare pages nobody reads
            ids = rng.permutation(total)[:sum(n_pages)].astype(np.int32)
            pages, k_scale, v_scale = _pages(rng, d, total, page_size, num_kv)
            indptr = np.concatenate([[0], np.cumsum(n_pages)]).astype(np.int32)
            last = np.array([n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, n_pages)], np.int32)
            keys, values = gather_pages(pages, indptr, ids, last, "NHD")
            batch = len(kv_lens)
            q = torch.from_numpy(rng.standard_normal((batch, num_kv * group, d)).astype(np.float32) * 2).to(
                dev, torch.bfloat16)
            ref_o, ref_l = reference_attention(variant, q.float().cpu().numpy(), keys, values,
                                               np.arange(batch + 1, dtype=np.int32), d ** -0.5, params,
                                               k_scale=k_scale, v_scale=v_scale)
            kv = PagedKV(torch.from_numpy(pages.view(np.uint8)).to(dev).view(torch.float8_e4m3fn),
                         torch.from_numpy(indptr).to(dev), torch.from_numpy(ids).to(dev),
                         torch.from_numpy(last).to(dev), "NHD")
            scales = dict(k_scale=torch.from_numpy(k_scale).to(dev), v_scale=torch.from_numpy(v_scale).to(dev))
            check_decode_plans(att, q, kv, d, ({"tensor_cores": True}, {"num_chunks": 3, "tensor_cores": True}),
                               ref_o, ref_l, tol=fp8_tolerance(q.float().cpu().numpy(), np.arange(batch + 1), keys,
                                                               values, k_scale, v_scale, ref_o, "bfloat16",
                                                               d ** -0.5),
                               lse_eps=float(torch.finfo(torch.bfloat16).eps), what=f"{name} D{d} group {group}",
                               params=params, **scales)


def _ramp_keys(rng, q_dir, scores, sm_scale, q_norm):
    """Keys [n, D] whose scores against a query of direction ``q_dir`` [D] and norm ``q_norm`` are ``scores`` [n]
    (plus a little noise across the other directions)."""
    keys = np.outer(scores / (sm_scale * q_norm), q_dir)
    noise = rng.standard_normal(keys.shape) * 0.05
    return keys + noise - np.outer(noise @ q_dir, q_dir)  # the noise orthogonal to q: the scores stay


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", (64, 128))
def test_fp8_tensor_core_decode_with_rising_and_falling_scores(head_dim, build_cache, rng):
    """Scores that climb slowly over a request (a few units of log2 a tile, as a running maximum meets them), then
    jump past it, or fall from the first key on, or climb then jump at the last key: the tensor-core decode's
    online softmax (the direct fp8 path at D 64 / 128) must rescale its state wherever the maximum moves, and keep
    weights of keys below the maximum exact, in one CTA or split (float64 reference on the dequantised cache)."""
    import torch

    from attngen.runtime import CUDAAttention, PagedKV, reference_attention
    from attngen.runtime.fp8 import kv_scale_for, quantize_kv
    from attngen.testing import FLOORS, check_decode_plans, paged_copy, rounding_error

    variant = builtin("vanilla")
    att = CUDAAttention.build(variant, head_dims=(head_dim,), dtypes=("bfloat16",), kv_dtypes=("float8_e4m3fn",),
                              layouts=("NHD",), kernels=("decode",), cache=build_cache)
    page_size, num_kv, group, d = 16, 2, 4, head_dim
    sm_scale = d ** -0.5
    n = 700
    ramp = np.linspace(-20.0, 40.0, n)  # natural-log units: about 1.4 (x log2 e: 2.0) per 16 keys
    jump = ramp.copy()
    jump[400] += 30.0  # far past the running maximum, mid-request
    late = ramp.copy()
    late[-1] += 12.0  # the last key
    profiles = [ramp, jump, ramp[::-1].copy(), late, ramp[:130]]  # climbing, a jump, falling, a late jump, short
    batch = len(profiles)
    q_dir = rng.standard_normal((num_kv, d))
    q_dir /= np.linalg.norm(q_dir, axis=1, keepdims=True)
    q_norm = 2.0 * np.sqrt(d)
    # every query head of a KV head's group near its direction (scores within a few percent of the profile)
    q = np.repeat(q_dir[None, :, None, :] * q_norm, batch, 0).repeat(group, 2)
    q = (q + rng.standard_normal(q.shape) * 0.02 * np.sqrt(d)).reshape(batch, num_kv * group, d)
    # the batch's keys and values as ragged rows [rows, Hkv, D], quantised with per-head scales, then paged
    k = np.concatenate([np.stack([_ramp_keys(rng, q_dir[h], s, sm_scale, q_norm) for h in range(num_kv)], 1)
                        for s in profiles]).astype(np.float32)
    v = rng.standard_normal(k.shape).astype(np.float32)
    k_scale, v_scale = (kv_scale_for(x, "float8_e4m3fn") for x in (k, v))
    k8, v8 = quantize_kv(k, "float8_e4m3fn", k_scale), quantize_kv(v, "float8_e4m3fn", v_scale)
    kv_indptr = np.concatenate([[0], np.cumsum([len(s) for s in profiles])])
    keys = [k8[kv_indptr[b]:kv_indptr[b + 1]] for b in range(batch)]
    values = [v8[kv_indptr[b]:kv_indptr[b + 1]] for b in range(batch)]
    host = paged_copy(torch.from_numpy(k8.view(np.uint8)), torch.from_numpy(v8.view(np.uint8)), kv_indptr, page_size,
                      "NHD", rng)
    dev = torch.device("cuda")
    kv = PagedKV(host.pages.to(dev).view(torch.float8_e4m3fn), host.indptr.to(dev), host.indices.to(dev),
                 host.last_page_len.to(dev), "NHD")
    tq = torch.from_numpy(q.astype(np.float32)).to(dev, torch.bfloat16)
    qf = tq.float().cpu().numpy()
    ref_o, ref_l = reference_attention(variant, qf, keys, values, np.arange(batch + 1, dtype=np.int32), sm_scale, {},
                                       k_scale=k_scale, v_scale=v_scale)
    scales = dict(k_scale=torch.from_numpy(k_scale).to(dev), v_scale=torch.from_numpy(v_scale).to(dev))
    # k x the answer's own bf16 rounding + floor: the half MMAs take the bf16 queries and fp8 keys exactly and add
    # in float32, and P is half (2^-12 relative), so the kernel's error is about the output's rounding. (fp8_tolerance
    # models PyTorch's bf16 attention, which rounds raw scores of several hundred here: too loose to see a missed
    # rescale of the row sum or of O.)
    tol = 8 * rounding_error(ref_o, "bfloat16") + FLOORS["bfloat16"]
    check_decode_plans(att, tq, kv, d, ({"tensor_cores": True, "num_chunks": 1}, {"tensor_cores": True},
                                        {"num_chunks": 5, "tensor_cores": True}),
                       ref_o, ref_l, tol=tol, lse_eps=float(torch.finfo(torch.bfloat16).eps),
                       what=f"rising scores D{d}", params={}, **scales)
