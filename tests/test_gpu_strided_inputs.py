"""Queries, keys and values that are views of one fused QKV projection ([tokens, (Hq + 2 Hkv) * D], split without
a copy), read in place by every CUDA template: the prefill templates (mma.sync and Hopper, whose query tensor map
takes the token stride, ragged K/V by their strides), the row-hook pass (a query transform reading strided rows),
and both decode templates. Each must give exactly what the same call gives on contiguous copies."""
import numpy as np
import pytest

from .test_gpu_decode import cuda_module
from .test_gpu_prefill import TEMPLATES, skip_unless_runs

pytestmark = pytest.mark.gpu

D, HQ, HKV = 128, 8, 2


def fused_qkv(tokens, dtype="float16", seed=0):
    """q [tokens, HQ, D], k, v [tokens, HKV, D] on the GPU: views of one [tokens, (HQ + 2 HKV) * D] tensor."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(tokens, (HQ + 2 * HKV) * D, device="cuda", generator=g).to(getattr(torch, dtype))
    q = qkv[:, :HQ * D].view(tokens, HQ, D)
    k = qkv[:, HQ * D:(HQ + HKV) * D].view(tokens, HKV, D)
    v = qkv[:, (HQ + HKV) * D:].view(tokens, HKV, D)
    return q, k, v


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("name,hook_pass", [("causal", None), ("rope", True), ("rope", False)])
def test_ragged_prefill_reads_a_fused_projection_in_place(template, name, hook_pass, build_cache):
    import torch

    from attngen.runtime import RaggedKV

    skip_unless_runs(template)
    att = cuda_module(name, build_cache, head_dims=(D,), dtypes=("float16",), kernels=("prefill",))
    lens = [300, 0, 1, 517, 64]
    tokens = sum(lens)
    q, k, v = fused_qkv(tokens)
    assert not q.is_contiguous() and not k.is_contiguous()
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    plan_kw = dict(template=template) | ({} if name == "causal" else dict(hook_pass=hook_pass))
    out = torch.full_like(q.contiguous(), float("nan"))
    lse = torch.full((tokens, HQ), float("nan"), device="cuda")
    kv = RaggedKV(k, v, indptr)
    att.prefill(q, kv, indptr, plan=att.plan_prefill(indptr, kv, D, **plan_kw), out=out, lse=lse)
    packed = RaggedKV(k.contiguous(), v.contiguous(), indptr)
    ref_o, ref_l = att.prefill(q.contiguous(), packed, indptr, plan=att.plan_prefill(indptr, packed, D, **plan_kw))
    torch.cuda.synchronize()
    assert torch.equal(out, ref_o) and torch.equal(lse, ref_l)


@pytest.mark.parametrize("template", TEMPLATES)
def test_paged_prefill_and_decode_read_strided_queries(template, build_cache):
    import torch

    from attngen.runtime import PagedKV

    skip_unless_runs(template)
    att = cuda_module("causal", build_cache, head_dims=(D,), dtypes=("float16",), kernels=("decode", "prefill"))
    kv_lens = [40, 1, 700, 129]
    n = [(x + 15) // 16 for x in kv_lens]
    pages = torch.randn(sum(n) + 3, 2, 16, HKV, D, dtype=torch.float16, device="cuda")
    kv = PagedKV(pages, torch.tensor(np.concatenate([[0], np.cumsum(n)]), dtype=torch.int32, device="cuda"),
                 torch.randperm(sum(n) + 3, dtype=torch.int32, device="cuda")[:sum(n)].contiguous(),
                 torch.tensor([x - 16 * (m - 1) for x, m in zip(kv_lens, n)], dtype=torch.int32, device="cuda"))
    qo_lens = [17, 1, 300, 2]
    q, _, _ = fused_qkv(sum(qo_lens), seed=1)
    qo = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32, device="cuda")
    out, lse = att.prefill(q, kv, qo, plan=att.plan_prefill(qo, kv, D, template=template))
    ref_o, ref_l = att.prefill(q.contiguous(), kv, qo, plan=att.plan_prefill(qo, kv, D, template=template))
    torch.cuda.synchronize()
    assert torch.equal(out, ref_o) and torch.equal(lse, ref_l)
    if template != TEMPLATES[0]:
        return  # (decode has no template choice: once)
    qd, _, _ = fused_qkv(len(kv_lens), seed=2)
    for tensor_cores in (False, True):
        plan = att.plan_decode(kv, HQ, D, tensor_cores=tensor_cores)
        out, lse = att.decode(qd, kv, plan=plan)
        ref_o, ref_l = att.decode(qd.contiguous(), kv, plan=plan)
        torch.cuda.synchronize()
        assert torch.equal(out, ref_o) and torch.equal(lse, ref_l), f"tensor_cores={tensor_cores}"


def test_the_entry_functions_refuse_unpacked_heads_themselves(build_cache):
    """Called without the runtime's checks (the TVM-FFI functions as a TVM program would), a query whose heads
    are not packed is refused by name instead of read as if it were."""
    import torch

    from attngen.runtime import RaggedKV

    att = cuda_module("causal", build_cache, head_dims=(D,), dtypes=("float16",), kernels=("prefill",))
    q = torch.zeros(4, HQ, 2 * D, dtype=torch.float16, device="cuda")[:, :, :D]
    k = torch.zeros(4, HKV, D, dtype=torch.float16, device="cuda")
    indptr = torch.tensor([0, 4], dtype=torch.int32, device="cuda")
    plan = att.plan_prefill(indptr, RaggedKV(k, k.clone(), indptr), D)
    fn = att.function("batch_prefill_ragged", "float16", D)
    out = torch.empty(4, HQ, D, dtype=torch.float16, device="cuda")
    lse = torch.empty(4, HQ, device="cuda")
    with pytest.raises(Exception, match="a token's heads must be packed"):
        fn(q, k, k.clone(), indptr, indptr, out, lse, 1.0, *plan.ffi_args())


def test_single_prefill_and_decode_read_a_fused_projection(build_cache):
    """runtime/single.py on the GPU: one request's q, k, v as views of a fused projection, through the ragged
    prefill (a decode as one query row): the batch call's results on contiguous copies."""
    import torch

    from attngen.runtime import RaggedKV, single_decode, single_prefill

    att = cuda_module("causal", build_cache, head_dims=(D,), dtypes=("float16",), kernels=("prefill",))
    q, k, v = fused_qkv(333, seed=3)
    out, lse = single_prefill(att, q, k, v, return_lse=True)
    indptr = torch.tensor([0, 333], dtype=torch.int32, device="cuda")
    ref_o, ref_l = att.prefill(q.contiguous(), RaggedKV(k.contiguous(), v.contiguous(), indptr), indptr)
    one = single_decode(att, q[-1], k, v)
    torch.cuda.synchronize()
    assert torch.equal(out, ref_o) and torch.equal(lse, ref_l)
    assert one.shape == (HQ, D) and torch.allclose(one.float(), ref_o[-1].float(), atol=2e-3)
