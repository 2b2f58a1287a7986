"""GPU: NaN and Inf in q, k, v follow the float64 reference's rules on both decode templates (with and
without a split-KV merge), on prefill (ragged and paged, both tile widths) and in the state merges.

The rules (attngen/runtime/reference.py): a NaN or +inf score poisons its row (O = NaN, lse = NaN), a -inf
score weighs 0, a row with no live key stays O = 0, lse = -inf, a non-finite value makes the columns it
enters non-finite. Unused page slots and spare pages are filled with NaN: the kernels must not let cache
memory outside the batch reach a row. Values are poisoned only at keys every row sees: the tile templates
multiply a masked key's value by weight 0 (0 x Inf = NaN), which the rules leave open.
"""
import numpy as np
import pytest

from attngen.runtime.reference import gather_pages, reference_attention
from attngen.testing import random_problem, tolerance

from .nonfinite import compare_nonfinite
from .test_gpu_decode import cuda_module, to_torch, variant

pytestmark = pytest.mark.gpu

D = 64
DTYPE = "float16"
# (what, request, key or query row, element value): keys index the request's own keys
INJECTIONS = {
    "q_nan": ("q", 0, 0, np.nan),
    "k_nan_first_key": ("k", 0, 0, np.nan),  # arrives while the running max is -inf
    "k_nan_last_key": ("k", 1, -1, np.nan),
    "k_pos_inf": ("k+", 0, 1, np.inf),  # the query element is made positive: a +inf score
    "k_neg_inf": ("k+", 0, 1, -np.inf),  # a -inf score: the key weighs 0
    "v_inf": ("v", 1, 2, np.inf),
    "v_nan": ("v", 0, 0, np.nan),
}


def _poison_unused_slots(prob):
    """NaN into every page slot no request owns (spare pages, the tails of last pages)."""
    used = np.zeros(prob.paged.pages.shape[0] * prob.paged.page_size, bool)
    for b, n in enumerate(prob.kv_lens):
        for j in range(n):
            page = prob.paged.indices[prob.paged.indptr[b] + j // prob.paged.page_size]
            used[page * prob.paged.page_size + j % prob.paged.page_size] = True
    for slot in np.flatnonzero(~used):
        page, s = divmod(int(slot), prob.paged.page_size)
        prob.paged.pages[page, :, s] = np.nan  # NHD


def _inject(prob, how: str, d: int = 5):
    where, b, j, value = INJECTIONS[how]
    if where == "q":
        prob.q[int(prob.qo_indptr[b]) + j, :, d] = value
        return
    if where == "k+":  # make every query element d of the request positive so that the score is value
        prob.q[int(prob.qo_indptr[b]):int(prob.qo_indptr[b + 1]), :, d] = 1.0
    half = 1 if where == "v" else 0
    j = j % prob.kv_lens[b]
    (prob.ragged.k if half == 0 else prob.ragged.v)[int(prob.ragged.indptr[b]) + j, :, d] = value
    page = prob.paged.indices[prob.paged.indptr[b] + j // prob.paged.page_size]
    prob.paged.pages[page, half, j % prob.paged.page_size, :, d] = value


def _problem(rng, qo_lens, kv_lens, how, name="vanilla"):
    """The problem with ``how`` injected and unused slots poisoned, and the tolerance of its clean twin."""
    prob = random_problem(rng, qo_lens, kv_lens, 8, 2, D, page_size=16, dtype="float32", layout="NHD",
                          spare_pages=2)
    tol = tolerance(prob, reference_attention(variant(name), prob.q, prob.keys, prob.values, prob.qo_indptr,
                                              1 / np.sqrt(D))[0], DTYPE, 1 / np.sqrt(D))
    _poison_unused_slots(prob)
    _inject(prob, how)
    return prob, tol


@pytest.mark.parametrize("how", list(INJECTIONS))
@pytest.mark.parametrize("num_chunks", [1, 3])
def test_decode_both_templates(how, num_chunks, build_cache, rng):
    import torch

    from attngen.runtime import PagedKV

    att = cuda_module("vanilla", build_cache, (D,), (DTYPE,), ("decode",))
    prob, tol = _problem(rng, [1, 1, 1], [37, 70, 0], how)  # request 2 has no key: stays empty
    q = to_torch(prob.q, DTYPE)
    pages = to_torch(prob.paged.pages, DTYPE)
    keys, values = gather_pages(pages.float().cpu().numpy(), prob.paged.indptr, prob.paged.indices,
                                prob.paged.last_page_len, "NHD")
    ref_o, ref_l = reference_attention(variant("vanilla"), q.float().cpu().numpy(), keys, values, prob.qo_indptr,
                                       1 / np.sqrt(D))
    kv = PagedKV(pages, to_torch(prob.paged.indptr), to_torch(prob.paged.indices), to_torch(prob.paged.last_page_len))
    for tensor_cores in (False, True):
        plan = att.plan_decode(kv, q.shape[1], D, num_chunks=num_chunks, tensor_cores=tensor_cores)
        out = torch.full_like(q, 7.0)
        lse = torch.full(q.shape[:2], 7.0, device="cuda")
        att.decode(q, kv, plan=plan, sm_scale=1 / np.sqrt(D), out=out, lse=lse)
        torch.cuda.synchronize()
        compare_nonfinite(out.float().cpu().numpy(), lse.cpu().numpy(), ref_o, ref_l, tol=tol, lse_tol=2e-2,
                          what=f"decode {how} chunks={num_chunks} tensor_cores={tensor_cores}")
    assert np.isneginf(ref_l[2]).all()


@pytest.mark.parametrize("how", list(INJECTIONS))
@pytest.mark.parametrize("kv_mode", ["ragged", "paged"])
@pytest.mark.parametrize("name", ["vanilla", "causal"])
def test_prefill_ragged_and_paged(how, kv_mode, name, build_cache, rng):
    import torch

    from attngen.runtime import PagedKV, RaggedKV

    att = cuda_module(name, build_cache, (D,), (DTYPE,), ("prefill",))
    # under causal a key is hidden from the rows before it: a poisoned score there is masked (never used),
    # a poisoned value would meet weight 0 in the tile's P V product
    if name == "causal" and INJECTIONS[how][0] == "v":
        pytest.skip("a causal tile multiplies a masked key's Inf value by 0; the rules leave that open")
    prob, tol = _problem(rng, [40, 3, 0, 2], [40, 75, 9, 0], how, name)
    q = to_torch(prob.q, DTYPE)
    if kv_mode == "ragged":
        k, v = to_torch(prob.ragged.k, DTYPE), to_torch(prob.ragged.v, DTYPE)
        kv = RaggedKV(k, v, to_torch(prob.ragged.indptr))
        ind = prob.ragged.indptr
        keys = [k.float().cpu().numpy()[ind[b]:ind[b + 1]] for b in range(4)]
        values = [v.float().cpu().numpy()[ind[b]:ind[b + 1]] for b in range(4)]
    else:
        pages = to_torch(prob.paged.pages, DTYPE)
        kv = PagedKV(pages, to_torch(prob.paged.indptr), to_torch(prob.paged.indices),
                     to_torch(prob.paged.last_page_len))
        keys, values = gather_pages(pages.float().cpu().numpy(), prob.paged.indptr, prob.paged.indices,
                                    prob.paged.last_page_len, "NHD")
    ref_o, ref_l = reference_attention(variant(name), q.float().cpu().numpy(), keys, values, prob.qo_indptr,
                                       1 / np.sqrt(D))
    qo_indptr = to_torch(prob.qo_indptr)
    runs = [("mma_sync", False), ("mma_sync", True)]
    if torch.cuda.get_device_capability()[0] == 9:
        runs.append(("hopper", None))  # the Hopper template, on the devices it runs on
    for template, wide in runs:
        plan = att.plan_prefill(qo_indptr, kv, D, wide_tiles=wide, template=template)
        out = torch.full_like(q, 7.0)
        lse = torch.full(q.shape[:2], 7.0, device="cuda")
        att.prefill(q, kv, qo_indptr, plan=plan, sm_scale=1 / np.sqrt(D), out=out, lse=lse)
        torch.cuda.synchronize()
        compare_nonfinite(out.float().cpu().numpy(), lse.cpu().numpy(), ref_o, ref_l, tol=tol, lse_tol=2e-2,
                          what=f"{name} prefill {template} {kv_mode} {how} wide={wide}")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_merges_keep_poison_and_empty_apart(dtype):
    import torch

    from attngen.runtime import merge_state, merge_states

    # rows: (finite, empty), (NaN, finite), (empty, NaN), (empty, empty), (NaN, empty)
    lse_a = torch.tensor([[1.0], [float("nan")], [float("-inf")], [float("-inf")], [float("nan")]])
    lse_b = torch.tensor([[float("-inf")], [2.0], [float("nan")], [float("-inf")], [float("-inf")]])
    va = torch.where(torch.isneginf(lse_a)[..., None], 0.0, torch.ones(5, 1, 64))
    vb = torch.where(torch.isneginf(lse_b)[..., None], 0.0, 2 * torch.ones(5, 1, 64))
    va[torch.isnan(lse_a)[:, 0]] = float("nan")
    vb[torch.isnan(lse_b)[:, 0]] = float("nan")
    t = getattr(torch, dtype)
    want = torch.tensor([1.0, float("nan"), float("nan"), float("-inf"), float("nan")])
    merged, merged_lse = merge_states(torch.stack([va, vb], 1).to(t).cuda(), torch.stack([lse_a, lse_b], 1).cuda())
    v, s = va.to(t).cuda(), lse_a.clone().cuda()
    merge_state(v, s, vb.to(t).cuda(), lse_b.cuda())
    for o, lse in ((merged, merged_lse), (v, s)):
        o, lse = o.float().cpu(), lse.cpu()[:, 0]
        assert torch.equal(torch.isnan(lse), torch.isnan(want)) and lse[0] == 1.0 and torch.isneginf(lse[3])
        assert (o[0] == 1).all() and (o[3] == 0).all() and torch.isnan(o[[1, 2, 4]]).all()
