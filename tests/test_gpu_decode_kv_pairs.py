"""KV-head pairs in the tensor-core decode (``plan_decode(kv_heads_per_cta=2)``: one CTA serves two KV heads, whose
rows of a token an NHD cache stores side by side), against the float64 reference, with the one-head launch
(``kv_heads_per_cta=1``) on the same inputs: fp8 caches at head dims 64 and 128 with per-head scales that differ
and a bfloat16 cache at 64; 1, 3 and 4 query heads per KV head over 2 and 4 KV heads; the load-balanced plan
(fused merge and merge kernel) and the even split. The variants' hooks read the query and KV head indices (a
logits hook and a mask: the fp8 direct-key path; with a key transform: the widened-key path), so a warp that
took its pair's other head, or a row of the other group, gives another answer. Then the refusals where no pair
serves the call, in ``plan_decode`` and in the exported function (``pytest -m gpu``)."""
import numpy as np
import pytest
from tvm.script import tirx as T

from attngen.ir import Variant

pytestmark = pytest.mark.gpu

KV_LENS = [1, 37, 0, 300, 16, 129, 700, 2000]  # an empty request, odd lengths, a full last page, split requests


@T.prim_func
def _head_logits(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                 kv_head: T.int32) -> T.float32:
    return s * (T.float32(1) + T.float32(0.25) * T.float32(kv_head)) + T.float32(0.25) * T.float32(qo_head % 3)


@T.prim_func
def _head_mask(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return (kv_pos + 2 * kv_head + qo_head) % 7 != 3


@T.prim_func
def _head_key(k: T.handle, k_out: T.handle, kv_pos: T.int32, kv_head: T.int32):
    d = T.int32()
    x = T.match_buffer(k, (d,), "float32")
    y = T.match_buffer(k_out, (d,), "float32")
    for i in range(d):
        y[i] = x[i] * (T.float32(1) + T.float32(0.5) * T.float32(kv_head))


def _variants():
    return {"head_scores": Variant("head_scores", logits_transform=_head_logits, logits_mask=_head_mask),
            "head_keys": Variant("head_keys", key_transform=_head_key, logits_mask=_head_mask)}


def _cache(rng, kv_dtype, head_dim, num_kv, dev, layout="NHD"):
    """Random pages (``layout``, permuted page ids, spare pages) of KV_LENS in ``kv_dtype``: (PagedKV, keys, values,
    k_scale, v_scale) with keys / values per request as stored and per-head scales (None for bfloat16)."""
    import torch

    from attngen.runtime import PagedKV
    from attngen.runtime.fp8 import kv_scale_for, quantize_kv
    from attngen.runtime.reference import gather_pages

    page = 16
    n_pages = [-(-n // page) for n in KV_LENS]
    total = sum(n_pages) + 3
    ids = rng.permutation(total)[:sum(n_pages)].astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(n_pages)]).astype(np.int32)
    last = np.array([n - (p - 1) * page if p else 0 for n, p in zip(KV_LENS, n_pages)], np.int32)
    raw = rng.standard_normal((total, 2, page, num_kv, head_dim)).astype(np.float32) * 2
    raw[:, :, :, 1::2] *= 0.1  # every other head in another range: per-head scales differ within a pair
    if kv_dtype == "bfloat16":
        stored, k_scale, v_scale = torch.from_numpy(raw).to(torch.bfloat16).float().numpy(), None, None
    else:
        k_scale = kv_scale_for(raw[:, 0].reshape(-1, num_kv, head_dim), kv_dtype)
        v_scale = kv_scale_for(raw[:, 1].reshape(-1, num_kv, head_dim), kv_dtype)
        stored = np.stack([quantize_kv(raw[:, 0], kv_dtype, k_scale), quantize_kv(raw[:, 1], kv_dtype, v_scale)], 1)
    if layout == "HND":  # [P, 2, Hkv, S, D]
        stored = np.ascontiguousarray(stored.transpose(0, 1, 3, 2, 4))
    if kv_dtype == "bfloat16":
        t = torch.from_numpy(stored).to(dev, torch.bfloat16)
    else:
        t = torch.from_numpy(stored.view(np.uint8)).to(dev).view(getattr(torch, kv_dtype))
    keys, values = gather_pages(stored, indptr, ids, last, layout)
    kv = PagedKV(t, torch.from_numpy(indptr).to(dev), torch.from_numpy(ids).to(dev), torch.from_numpy(last).to(dev),
                 layout)
    return kv, keys, values, k_scale, v_scale


def _library(name, build_cache):
    """The variant's decode library: bfloat16 queries over bfloat16 and e4m3 caches at head dims 64 and 128; NHD,
    and for head_scores HND too (pairs asked for explicitly there)."""
    from attngen.runtime import CUDAAttention

    return CUDAAttention.build(_variants()[name], head_dims=(64, 128), dtypes=("bfloat16", "bfloat16"),
                               kv_dtypes=("bfloat16", "float8_e4m3fn"),
                               layouts=("NHD", "HND") if name == "head_scores" else ("NHD",), kernels=("decode",),
                               cache=build_cache)


@pytest.mark.parametrize("name", ["head_scores", "head_keys"])
def test_kv_head_pairs_match_the_reference_and_the_one_head_launch(name, build_cache, rng):
    import torch

    from attngen.runtime import reference_attention
    from attngen.testing import Problem, check_decode_plans, fp8_tolerance, tolerance

    variant = _variants()[name]
    att = _library(name, build_cache)
    dev = torch.device("cuda")
    batch, indptr1 = len(KV_LENS), np.arange(len(KV_LENS) + 1, dtype=np.int32)
    cases = [(kv_dtype, d, num_kv, group, "NHD") for kv_dtype, d in
             (("float8_e4m3fn", 64), ("float8_e4m3fn", 128), ("bfloat16", 64)) for num_kv, group in
             ((2, 1), (2, 4), (4, 3))]
    if name == "head_scores":
        cases.append(("float8_e4m3fn", 128, 2, 4, "HND"))
    for kv_dtype, d, num_kv, group, layout in cases:
        kv, keys, values, k_scale, v_scale = _cache(rng, kv_dtype, d, num_kv, dev, layout)
        q = torch.from_numpy(rng.standard_normal((batch, num_kv * group, d)).astype(np.float32)).to(
            dev, torch.bfloat16)
        q_r = q.float().cpu().numpy()
        scales = {} if k_scale is None else {"k_scale": k_scale, "v_scale": v_scale}
        ref_o, ref_l = reference_attention(variant, q_r, keys, values, indptr1, d ** -0.5, {}, **scales)
        if k_scale is None:
            prob = Problem(q_r, indptr1, None, None, keys, values, [1] * batch, KV_LENS)
            tol = tolerance(prob, ref_o, "bfloat16", d ** -0.5)
        else:
            tol = fp8_tolerance(q_r, indptr1, keys, values, k_scale, v_scale, ref_o, "bfloat16", d ** -0.5)
        plans = [dict(kv_heads_per_cta=k, **extra) for k in (1, 2)
                 for extra in ({"tensor_cores": True, "fused_merge": True}, {"fused_merge": False},
                               {"num_chunks": 3, "tensor_cores": True}, {"graph_safe": True},
                               {"fixed_chunk": 256})]
        dev_scales = {k: torch.from_numpy(v).to(dev) for k, v in scales.items()}
        check_decode_plans(att, q, kv, d, plans, ref_o, ref_l, tol=tol,
                           lse_eps=float(torch.finfo(torch.bfloat16).eps),
                           what=f"{name} {kv_dtype} D{d} Hkv {num_kv} group {group} {layout}", **dev_scales)
        fused = att.plan_decode(kv, q.shape[1], d, kv_heads_per_cta=2, tensor_cores=True, fused_merge=True)
        assert fused.fused_merge and len(fused.split.merge_tiles) > 0  # the kernel's own merge ran above
        # the automatic choice: this batch is too small and uneven to pay for pairs (decode_plan._pairs_pay)
        for extra in ({}, {"num_chunks": 3, "tensor_cores": True}):
            assert att.plan_decode(kv, q.shape[1], d, **extra).kv_heads_per_cta == 1


def test_kv_head_pairs_are_refused_where_none_serves(build_cache, rng):
    import torch

    from attngen.runtime.checks import AttentionArgumentError

    att = _library("head_scores", build_cache)
    dev = torch.device("cuda")
    kv, *_ = _cache(rng, "bfloat16", 128, 2, dev)
    with pytest.raises(AttentionArgumentError, match=r"kv_heads_per_cta=2: .*head_dim 128, 2-byte elements"):
        att.plan_decode(kv, 4, 128, kv_heads_per_cta=2)  # rows of 256 bytes
    assert att.plan_decode(kv, 4, 128).kv_heads_per_cta == 1  # the automatic choice: one head
    kv64, *_ = _cache(rng, "bfloat16", 64, 2, dev)
    with pytest.raises(AttentionArgumentError, match=r"group 5"):
        att.plan_decode(kv64, 10, 64, kv_heads_per_cta=2)  # 2 x 5 query rows > 8
    with pytest.raises(AttentionArgumentError, match=r"not surely on the tensor-core template"):
        att.plan_decode(kv64, 4, 64, kv_heads_per_cta=2, tensor_cores=False)
    with pytest.raises(AttentionArgumentError, match=r"not surely on the tensor-core template"):
        att.plan_decode(kv64, 4, 64, kv_heads_per_cta=2, num_chunks=3)  # the launcher's choice
    assert att.plan_decode(kv64, 4, 64, num_chunks=3).kv_heads_per_cta == 1
    with pytest.raises(AttentionArgumentError, match=r"kv_heads_per_cta: must be 1, 2 or None"):
        att.plan_decode(kv64, 4, 64, kv_heads_per_cta=4)
    kv3, *_ = _cache(rng, "float8_e4m3fn", 64, 3, dev)
    with pytest.raises(AttentionArgumentError, match=r"3 KV heads"):
        att.plan_decode(kv3, 3, 64, kv_heads_per_cta=2)
    assert att.plan_decode(kv3, 3, 64).kv_heads_per_cta == 1
    # the exported function refuses a pair it cannot serve before launching anything
    fn = att.function("batch_decode_paged_nhd", "bfloat16", 128)
    q = torch.zeros(len(KV_LENS), 4, 128, dtype=torch.bfloat16, device=dev)
    part = torch.empty(1, device=dev)
    args = (q, kv.pages, kv.indices, kv.indptr, kv.last_page_len, torch.empty_like(q),
            torch.empty(len(KV_LENS), 4, device=dev), 0.1, part, part, 1, 2, None, 0, 0)
    with pytest.raises(ValueError, match=r"kv_heads_per_cta=2 pairs KV heads whose rows are at most 128 bytes"):
        fn(*args, 2)
    with pytest.raises(ValueError, match=r"kv_heads_per_cta must be 1 or 2, got 0"):
        fn(*args, 0)
    fn(*args, 1)  # the same call with one head per CTA runs
    torch.cuda.synchronize()
