"""Page pools that are not one contiguous [num_pages, 2, ...] tensor, read in place by every CUDA template:
vLLM's [2, num_pages, page_size, H, D] cache as ``cache.transpose(0, 1)``, FlashInfer's pair ``(k_pages,
v_pages)`` of views of one allocation, and pools with gaps between pages (runtime/kv_pool.py). Each call must
give exactly what the same call gives on a contiguous copy of the pool; appends land where the pool lies; and
the entry functions refuse, by name, a pool whose strides they cannot read."""
import numpy as np
import pytest

from .test_gpu_decode import cuda_module
from .test_gpu_prefill import TEMPLATES, skip_unless_runs

pytestmark = pytest.mark.gpu

D, HQ, HKV, PS = 128, 8, 2, 16
KV_LENS = [40, 1, 700, 129, 0]


def pools(layout, seed=0, dtype="float16"):
    """{form: pages} of the same random values, and the page table of KV_LENS over them in random page order:
    'contiguous' [P, 2, ...], 'vllm' (a [2, P, ...] cache transposed), 'pair' (that cache's halves, as a
    PagedKV makes its view) and 'gaps' (each page and each half followed by unused rows)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    n = [(x + PS - 1) // PS for x in KV_LENS]
    num_pages = sum(n) + 3
    inner = (PS, HKV, D) if layout == "NHD" else (HKV, PS, D)
    base = torch.randn(num_pages, 2, *inner, device="cuda", generator=g).to(getattr(torch, dtype))
    cache = base.transpose(0, 1).contiguous()  # [2, P, ...]
    padded = torch.full((num_pages, 3, inner[0] + 1, *inner[1:]), float("nan"), device="cuda").to(base.dtype)
    padded[:, :2, :inner[0]] = base
    forms = {"contiguous": base, "vllm": cache.transpose(0, 1), "pair": (cache[0], cache[1]),
             "gaps": padded[:, :2, :inner[0]]}
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(n)]), dtype=torch.int32, device="cuda")
    indices = torch.randperm(num_pages, generator=g, device="cuda")[:sum(n)].to(torch.int32)
    last = torch.tensor([x - PS * (m - 1) if m else 1 for x, m in zip(KV_LENS, n)], dtype=torch.int32, device="cuda")
    return forms, (indptr, indices, last)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("template", TEMPLATES)
def test_prefill_reads_strided_pools_in_place(template, layout, build_cache):
    import torch

    from attngen.runtime import PagedKV

    skip_unless_runs(template)
    att = cuda_module("causal", build_cache, head_dims=(D,), dtypes=("float16",), kernels=("decode", "prefill"))
    forms, table = pools(layout)
    qo_lens = [17, 1, 300, 2, 0]
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(sum(qo_lens), HQ, D, device="cuda", generator=g).half()
    qo = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32, device="cuda")
    ref = PagedKV(forms["contiguous"], *table, layout)
    ref_o, ref_l = att.prefill(q, ref, qo, plan=att.plan_prefill(qo, ref, D, template=template))
    for form in ("vllm", "pair", "gaps"):
        kv = PagedKV(forms[form], *table, layout)
        assert not kv.pages.is_contiguous()
        out = torch.full_like(ref_o, float("nan"))
        lse = torch.full_like(ref_l, float("nan"))
        att.prefill(q, kv, qo, plan=att.plan_prefill(qo, kv, D, template=template), out=out, lse=lse)
        torch.cuda.synchronize()
        assert torch.equal(out, ref_o) and torch.equal(lse, ref_l), form
    if template != TEMPLATES[0]:
        return  # (decode has no template choice: once per layout)
    qd = torch.randn(len(KV_LENS), HQ, D, device="cuda", generator=g).half()
    for tensor_cores in (False, True):
        ref_o, ref_l = att.decode(qd, ref, plan=att.plan_decode(ref, HQ, D, tensor_cores=tensor_cores))
        for form in ("vllm", "pair", "gaps"):
            kv = PagedKV(forms[form], *table, layout)
            out, lse = att.decode(qd, kv, plan=att.plan_decode(kv, HQ, D, tensor_cores=tensor_cores))
            torch.cuda.synchronize()
            assert torch.equal(out, ref_o) and torch.equal(lse, ref_l), (form, tensor_cores)


def test_fp8_decode_reads_a_vllm_cache_in_place(build_cache):
    import torch

    from attngen.runtime import CUDAAttention, PagedKV
    from attngen.variants import builtin

    att = CUDAAttention.build(builtin("vanilla"), head_dims=(D,), dtypes=("float16",),
                              kv_dtypes=("float8_e4m3fn",), kernels=("decode",), cache=build_cache)
    forms, table = pools("NHD", seed=3)
    cache = forms["vllm"].transpose(0, 1).contiguous().to(torch.float8_e4m3fn)  # [2, P, ...] fp8
    fp8 = {"contiguous": cache.transpose(0, 1).contiguous(), "vllm": cache.transpose(0, 1),
           "pair": (cache[0], cache[1])}
    q = torch.randn(len(KV_LENS), HQ, D, device="cuda").half()
    ref = PagedKV(fp8["contiguous"], *table)
    for tensor_cores in (False, True):
        ref_o, ref_l = att.decode(q, ref, plan=att.plan_decode(ref, HQ, D, tensor_cores=tensor_cores),
                                  k_scale=0.5, v_scale=2.0)
        for form in ("vllm", "pair"):
            kv = PagedKV(fp8[form], *table)
            out, lse = att.decode(q, kv, plan=att.plan_decode(kv, HQ, D, tensor_cores=tensor_cores),
                                  k_scale=0.5, v_scale=2.0)
            torch.cuda.synchronize()
            assert torch.equal(out, ref_o) and torch.equal(lse, ref_l), (form, tensor_cores)


def test_append_writes_into_a_vllm_cache_where_it_lies(build_cache):
    """append_paged_kv into the transposed view of a [2, P, ...] cache: the rows land in the cache itself, and a
    decode over the view reads them as over a contiguous pool that got the same append."""
    import torch

    from attngen.runtime import PagedKV, append_paged_kv

    att = cuda_module("causal", build_cache, head_dims=(D,), dtypes=("float16",), kernels=("decode", "prefill"))
    forms, table = pools("NHD", seed=4)
    cache = forms["vllm"].transpose(0, 1).contiguous()  # a cache of its own, written through the view
    view, flat = PagedKV((cache[0], cache[1]), *table), PagedKV(forms["contiguous"].clone(), *table)
    new = torch.tensor([0, 2, 3, 3, 5, 5], dtype=torch.int32)  # rows appended per request (the views count them)
    k = torch.randn(5, HKV, D, device="cuda").half()
    v = torch.randn(5, HKV, D, device="cuda").half()
    append_paged_kv(view, k, v, new)
    append_paged_kv(flat, k, v, new)
    torch.cuda.synchronize()
    assert torch.equal(cache.transpose(0, 1), flat.pages)
    q = torch.randn(len(KV_LENS), HQ, D, device="cuda").half()
    out, _ = att.decode(q, view, plan=att.plan_decode(view, HQ, D))
    ref, _ = att.decode(q, flat, plan=att.plan_decode(flat, HQ, D))
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


def test_the_entry_functions_refuse_unreadable_pools_themselves(build_cache):
    """Called without the runtime's checks, a pool whose rows are not contiguous or whose heads lie an odd
    number of elements apart is refused by name instead of read with misaligned 16-byte copies."""
    import torch

    att = cuda_module("causal", build_cache, head_dims=(D,), dtypes=("float16",), kernels=("decode", "prefill"))
    fn = att.function("batch_prefill_paged_nhd", "float16", D)
    indptr = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    q = torch.zeros(1, HQ, D, dtype=torch.float16, device="cuda")
    out, lse = torch.empty_like(q), torch.empty(1, HQ, device="cuda")
    from attngen.runtime import PagedKV

    good = torch.zeros(2, 2, PS, HKV, D, dtype=torch.float16, device="cuda")
    plan = att.plan_prefill(indptr, PagedKV(good, indptr, indptr[:1], indptr[1:]), D)
    bad_rows = torch.zeros(2, 2, PS, HKV, 2 * D, dtype=torch.float16, device="cuda")[..., ::2]
    bad_heads = torch.zeros(2, 2, PS, HKV, D + 4, dtype=torch.float16, device="cuda")[..., :D]
    three = torch.zeros(2, 3, PS, HKV, D, dtype=torch.float16, device="cuda")
    wide = torch.zeros(2, 2, PS, HKV, 2 * D, dtype=torch.float16, device="cuda")
    for pages, msg in ((bad_rows, "rows .head_dim. must be contiguous"), (bad_heads, "positive multiples of 16"),
                       (three, "dim 1 holds a page's keys and values and must be 2"),
                       (wide, f"head_dim {2 * D}, this function was built for {D}")):
        with pytest.raises(Exception, match=msg):
            fn(q, pages, indptr[:1], indptr, indptr[1:], indptr, out, lse, 1.0, *plan.ffi_args())


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("template", TEMPLATES)
def test_the_row_hook_pass_packs_strided_pools(template, layout, build_cache):
    """A key-transform variant (RoPE) applies its hooks once per row into a packed workspace whatever the pool's
    strides (csrc/hook_pass.cuh hook_pass_packed_pages): vLLM's cache, the pair and a pool with gaps give exactly
    the contiguous pool's results, and agree with the per-tile hooks to rounding."""
    import torch

    from attngen.runtime import PagedKV

    skip_unless_runs(template)
    att = cuda_module("rope", build_cache, head_dims=(D,), dtypes=("float16",), kernels=("prefill",))
    forms, table = pools(layout, seed=5)
    qo_lens = [17, 1, 300, 2, 0]
    q = torch.randn(sum(qo_lens), HQ, D, device="cuda").half()
    qo = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32, device="cuda")
    ref = PagedKV(forms["contiguous"], *table, layout)
    ref_o, ref_l = att.prefill(q, ref, qo, plan=att.plan_prefill(qo, ref, D, template=template, hook_pass=True))
    tile_o, _ = att.prefill(q, ref, qo, plan=att.plan_prefill(qo, ref, D, template=template, hook_pass=False))
    torch.cuda.synchronize()
    assert (ref_o.float() - tile_o.float()).abs().max() < 2e-2
    for form in ("vllm", "pair", "gaps"):
        kv = PagedKV(forms[form], *table, layout)
        out, lse = att.prefill(q, kv, qo, plan=att.plan_prefill(qo, kv, D, template=template, hook_pass=True))
        torch.cuda.synchronize()
        assert torch.equal(out, ref_o) and torch.equal(lse, ref_l), form
