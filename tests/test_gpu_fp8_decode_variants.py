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
