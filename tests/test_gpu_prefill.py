"""GPU: the FA2-class prefill / append template for every built-in variant against the float64 reference.

Ragged and paged (NHD, HND) KV with random page permutations, append (qo_len < kv_len),
a zero-length request and a request without keys, GQA ratios 1, 4, 8, 5, fp16 and bf16,
head dims 64/128/256 (test_gpu_decode.py's ``VARIANT_CONFIGS``), outputs poisoned with NaN; every case on both
templates: the mma.sync one on both query tiles (64 rows, and the 128-row tile (two m-tiles per warp) that long
requests may ask for), and the Hopper one (sm_90a; skipped on other devices).
"""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tvm.script import tirx as T

from attngen.runtime import mma_split
from attngen.runtime.reference import gather_pages, reference_attention
from attngen.testing import Problem, causal_slices, compare, paged_copy, random_params, random_problem, tolerance

from .test_gpu_decode import VARIANT_CONFIGS, cuda_module, to_torch, variant

pytestmark = pytest.mark.gpu


TEMPLATES = ("mma_sync", "hopper")


def skip_unless_runs(template: str) -> None:
    import torch

    if template == "hopper" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper prefill template runs on devices of compute capability 9.0 only")


def run_prefill(att, v, rng, *, group, head_dim, dtype, kv_mode, qo_lens, kv_lens, template="mma_sync",
                make_params=random_params, tile_map=None, plans=None, num_kv=2, hook_pass=None, outputs=None,
                ref_rows=0, tail_split=None):
    """Runs the case (``num_kv`` KV heads, ``group`` query heads each) against the float64 reference;
    ``plans`` (a list) collects the plans used, ``outputs`` (a list) each plan's (out, lse); ``hook_pass``: the
    plans' row-hook pass choice; ``tail_split``: the plans' (None or False; a tuple: a plan for each, on the same
    inputs and reference). ``ref_rows`` > 0 (causal masks
    only: causal_slices): the reference and the comparison cover three blocks of that many rows of each long
    request instead of every row."""
    import torch

    from attngen.runtime import PagedKV, RaggedKV

    layout = "HND" if kv_mode == "HND" else "NHD"
    prob = random_problem(rng, qo_lens, kv_lens, num_kv * group, num_kv, head_dim, page_size=16,
                          dtype="float32", layout=layout)
    q = to_torch(prob.q, dtype)
    q_r = q.float().cpu().numpy()
    if kv_mode == "ragged":
        k, vv = to_torch(prob.ragged.k, dtype), to_torch(prob.ragged.v, dtype)
        kv = RaggedKV(k, vv, to_torch(prob.ragged.indptr))
        ind = prob.ragged.indptr
        kr, vr = k.float().cpu().numpy(), vv.float().cpu().numpy()
        keys = [kr[ind[b]:ind[b + 1]] for b in range(len(kv_lens))]
        values = [vr[ind[b]:ind[b + 1]] for b in range(len(kv_lens))]
    else:
        pages = to_torch(prob.paged.pages, dtype)
        kv = PagedKV(pages, to_torch(prob.paged.indptr), to_torch(prob.paged.indices),
                     to_torch(prob.paged.last_page_len), layout)
        keys, values = gather_pages(pages.float().cpu().numpy(), prob.paged.indptr, prob.paged.indices,
                                    prob.paged.last_page_len, layout)
    ref_prob = Problem(q_r, prob.qo_indptr, prob.ragged, prob.paged, keys, values, list(qo_lens), list(kv_lens))
    picked = slice(None)
    if ref_rows:
        picked, ref_prob = causal_slices(ref_prob, ref_rows)
    params = make_params(v, rng, ref_prob)
    sm_scale = 1.0 / np.sqrt(head_dim)
    ref_o, ref_l = reference_attention(v, ref_prob.q, ref_prob.keys, ref_prob.values, ref_prob.qo_indptr, sm_scale,
                                       params)
    dev_params = {k_: (to_torch(x) if isinstance(x, np.ndarray) else x) for k_, x in params.items()}
    qo_indptr = to_torch(prob.qo_indptr)
    tol = tolerance(ref_prob, ref_o, dtype, sm_scale)
    results = []
    # mma.sync: the 64-row and the 128-row (two m-tiles per warp) tiles on the same inputs
    splits = tail_split if isinstance(tail_split, tuple) else (tail_split,)
    for wide, split in ((w, s_) for w in ((False, True) if template == "mma_sync" else (None,)) for s_ in splits):
        plan = att.plan_prefill(qo_indptr, kv, head_dim, wide_tiles=wide, template=template, tile_map=tile_map,
                                hook_pass=hook_pass, tail_split=split)
        if plans is not None:
            plans.append(plan)
        out = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:2], float("nan"), device="cuda")
        att.prefill(q, kv, qo_indptr, plan=plan, sm_scale=sm_scale, params=dev_params, out=out, lse=lse)
        torch.cuda.synchronize()
        if outputs is not None:
            outputs.append((out, lse))
        results.append(compare(out.float().cpu().numpy()[picked], lse.cpu().numpy()[picked], ref_o, ref_l,
                               tol=tol, lse_tol=2e-2,
                               what=f"{v.name} prefill {template} {kv_mode} {dtype} d{head_dim} g{group} wide={wide}"
                                    f" tail_split={split}"))
    return results


def one_ragged_request(rows, keys, hq, hkv, head_dim, seed):
    """q [rows, hq, head_dim], a RaggedKV of one request's keys [keys, hkv, head_dim] and the query indptr [2]:
    bf16 normal draws on the GPU from a generator seeded with ``seed``, drawn q, K, V in that order."""
    import torch

    from attngen.runtime import RaggedKV

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(rows, hq, head_dim, device="cuda", generator=g).bfloat16()
    k = torch.randn(keys, hkv, head_dim, device="cuda", generator=g).bfloat16()
    v = torch.randn(keys, hkv, head_dim, device="cuda", generator=g).bfloat16()
    qo = torch.tensor([0, rows], dtype=torch.int32, device="cuda")
    return q, RaggedKV(k, v, torch.tensor([0, keys], dtype=torch.int32, device="cuda")), qo


def one_request_params(v, rng, rows, keys, hq=16):
    """Random parameters of variant ``v`` for one request of ``rows`` query rows over ``keys`` keys (``hq`` query
    heads), tensors on the GPU."""
    shape = SimpleNamespace(q=np.zeros((1, hq, 1)), qo_lens=[rows], kv_lens=[keys])
    return {k_: (to_torch(x) if isinstance(x, np.ndarray) else x) for k_, x in random_params(v, rng, shape).items()}


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("name,head_dim,dtype", VARIANT_CONFIGS)
def test_prefill_matches_reference(name, head_dim, dtype, template, build_cache, rng):
    skip_unless_runs(template)
    att = cuda_module(name, build_cache, (head_dim,), (dtype,), ("prefill",))
    v = variant(name)
    for group, kv_mode in [(1, "ragged"), (4, "NHD"), (8, "HND"), (5, "NHD")]:
        run_prefill(att, v, rng, group=group, head_dim=head_dim, dtype=dtype, kv_mode=kv_mode,
                    qo_lens=[37, 0, 100, 3, 1], kv_lens=[37, 5, 180, 0, 70], template=template)
    # long enough for the 128-row tile (at least 256 rows of tokens x group heads); several KV tiles
    run_prefill(att, v, rng, group=4, head_dim=head_dim, dtype=dtype, kv_mode="NHD",
                qo_lens=[90, 0, 7], kv_lens=[300, 4, 7], template=template)


@pytest.mark.parametrize("template", TEMPLATES)
def test_long_causal_prefill(template, build_cache, rng):
    skip_unless_runs(template)
    att = cuda_module("causal", build_cache, (128,), ("bfloat16",), ("prefill",))
    run_prefill(att, variant("causal"), rng, group=4, head_dim=128, dtype="bfloat16", kv_mode="NHD",
                qo_lens=[1000, 300], kv_lens=[1000, 2000], template=template)


@pytest.mark.parametrize("template", TEMPLATES)
def test_long_maskless_prefill_at_head_dim_64(template, build_cache, rng):
    """A maskless variant at head_dim 64 runs the Hopper template's wide tiling (192 keys) at every length: many
    key tiles per item, a partial last one (2000 = 10 x 192 + 80; 1000 = 5 x 192 + 40), paged and ragged."""
    skip_unless_runs(template)
    att = cuda_module("vanilla", build_cache, (64,), ("bfloat16",), ("prefill",))
    for kv_mode in ("HND", "ragged"):
        run_prefill(att, variant("vanilla"), rng, group=4, head_dim=64, dtype="bfloat16", kv_mode=kv_mode,
                    qo_lens=[700, 0, 300], kv_lens=[1000, 3, 2000], template=template)


@pytest.mark.parametrize("name,head_dim", [("vanilla", 128), ("vanilla", 64), ("vanilla", 256),
                                           ("attention_sink", 128)])
def test_tail_split_matches_the_reference(name, head_dim, build_cache, rng):
    """Batches whose Hopper work leaves its last round part-filled (more items than SMs, not a multiple) run
    their last items as key-tile pieces merged in the kernel (runtime/work_tail.py, csrc/hopper_tail.cuh):
    against the float64 reference, ragged and paged, with a request of no rows, and with the split off; the
    plan's order carries the split (its tensor runs past the pairs). attention_sink: an output hook after the
    merge. A second call of the same plan reuses the counters the first left at zero."""
    import torch

    skip_unless_runs("hopper")
    att = cuda_module(name, build_cache, (head_dim,), ("bfloat16",), ("prefill",))
    v = variant(name)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # (one full round of 132 items and a few more: the plan splits the few; runtime/work_tail.py)
    for kv_mode, qo_lens, kv_lens in [("ragged", [1100], [3000]), ("HND", [1100, 0, 40], [3000, 3, 500])]:
        plans = []  # the split plan, then the unsplit one, on the same inputs
        run_prefill(att, v, rng, group=4, head_dim=head_dim, dtype="bfloat16", kv_mode=kv_mode, qo_lens=qo_lens,
                    kv_lens=kv_lens, template="hopper", num_kv=4, plans=plans, tail_split=(None, False))
        pairs = len(qo_lens) * -(-max(qo_lens) * 4 // 128)
        orders = list(plans[0].orders.values())
        assert len(orders) == 1 and (orders[0].numel() > pairs) == (pairs * 4 > sms), orders[0].numel()
        unsplit = list(plans[1].orders.values())  # (the pairs alone, no pieces behind them)
        assert len(unsplit) == 1 and unsplit[0].numel() == pairs, [o.numel() for o in unsplit]
    # the same inputs twice through one split plan: the same bits (every slot merged in slot order, whichever
    # piece ends last; the counters back at zero after each call), and the unsplit plan's result to rounding
    q, kv, qo = one_ragged_request(1100, 3000, 16, 4, head_dim, seed=1)
    params = one_request_params(v, rng, 1100, 3000)
    runs = []
    for split in (None, None, False):
        plan = att.plan_prefill(qo, kv, head_dim, template="hopper", tail_split=split)
        out = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:2], float("nan"), device="cuda")
        runs.append(att.prefill(q, kv, qo, plan=plan, params=params, out=out, lse=lse))
        assert all((o.numel() > 35) == (split is None) for o in plan.orders.values())  # (35 pairs)
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    torch.testing.assert_close(runs[0][0].float(), runs[2][0].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(runs[0][1], runs[2][1], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("name", ["causal", "vanilla", "sliding_window_causal"])
def test_appends_of_few_rows_split_their_keys_over_the_sms(name, build_cache, rng):
    """Appends of a few query rows over many keys (speculative decoding's verify step, a chunk of a long prompt)
    give the Hopper template fewer items than SMs: the plan cuts every item's key tiles into pieces over all SMs,
    merged in the kernel (split-KV; runtime/work_tail.py). Against the float64 reference, paged with random page
    order and ragged, with a request of no rows, and with the split off. The sliding window's bound
    is a parameter the plan cannot count tiles by: its plans take no split."""
    skip_unless_runs("hopper")
    att = cuda_module(name, build_cache, (128,), ("bfloat16",), ("prefill",))
    v = variant(name)
    for kv_mode, qo_lens, kv_lens in [("NHD", [8], [8192]), ("ragged", [3, 16, 0, 5], [2000, 6000, 40, 5]),
                                      ("HND", [64, 1], [9000, 700])]:
        plans = []  # the split plan, then the unsplit one, on the same inputs
        run_prefill(att, v, rng, group=4, head_dim=128, dtype="bfloat16", kv_mode=kv_mode, qo_lens=qo_lens,
                    kv_lens=kv_lens, template="hopper", num_kv=4, plans=plans, tail_split=(None, False))
        pairs = len(qo_lens) * -(-max(qo_lens) * 4 // 128)
        (split,), (unsplit,) = plans[0].orders.values(), plans[1].orders.values()
        assert (split.numel() > pairs) == (name != "sliding_window_causal"), (split.numel(), pairs)
        assert unsplit.numel() == pairs
    if name != "sliding_window_causal":
        _check_repeated_split_calls(att, v, rng, 128)


def _check_repeated_split_calls(att, v, rng, head_dim):
    """One plan of a verify step (8 rows over 8192 keys, 4 KV heads: every item cut, one piece a CTA, so the
    plan is spread: its pieces merge side by side, csrc/hopper_tail.cuh), three calls: the same bits (slots merged
    in slot order whichever piece ends last; the counters' two generations, 0 and 2^30, each call leaving the
    other's base for the next), then the call captured in a CUDA graph (a tail split's launch is cooperative)
    and replayed twice: the same bits again."""
    import torch

    q, kv, qo = one_ragged_request(8, 8192, 16, 4, head_dim, seed=2)
    params = one_request_params(v, rng, 8, 8192)
    plan = att.plan_prefill(qo, kv, head_dim, template="hopper")
    runs = []
    for _ in range(3):
        out = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:2], float("nan"), device="cuda")
        runs.append(att.prefill(q, kv, qo, plan=plan, params=params, out=out, lse=lse))
    (order,) = plan.orders.values()  # (made at the plan's first call)
    assert int(order[1 + 11]) == 1  # (one pair: the tail section's header from entry 1, its spread word)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], float("nan"), device="cuda")
    graph = _captured(lambda: att.prefill(q, kv, qo, plan=plan, params=params, out=out, lse=lse))
    for _ in range(2):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        runs.append((out.clone(), lse.clone()))
    for r in runs[1:]:
        assert torch.equal(runs[0][0], r[0]) and torch.equal(runs[0][1], r[1])


@pytest.mark.parametrize("head_dim", [64, 256])
def test_spread_merges_at_other_head_dims(head_dim, build_cache, rng):
    """The side-by-side merge of a spread plan's pieces (each merges a 16-column stripe of its item's rows, D / 16
    stripes: 4 at head dim 64, 16 at 256) against the float64 reference, paged with random page order and ragged,
    and repeated calls of one plan giving the same bits."""
    skip_unless_runs("hopper")
    att = cuda_module("vanilla", build_cache, (head_dim,), ("bfloat16",), ("prefill",))
    v = variant("vanilla")
    for kv_mode, qo_lens, kv_lens in [("NHD", [8], [8192]), ("ragged", [3, 16, 0, 5], [2000, 6000, 40, 5])]:
        plans = []
        run_prefill(att, v, rng, group=4, head_dim=head_dim, dtype="bfloat16", kv_mode=kv_mode, qo_lens=qo_lens,
                    kv_lens=kv_lens, template="hopper", num_kv=4, plans=plans, tail_split=(None,))
        (order,) = plans[0].orders.values()
        pairs = len(qo_lens) * -(-max(qo_lens) * 4 // 128)
        assert order.numel() > pairs  # (a tail split; the verify step's is spread: _check_repeated_split_calls)
    _check_repeated_split_calls(att, v, rng, head_dim)


@pytest.mark.parametrize("name", ["causal", "vanilla"])
def test_paged_views_of_any_page_size_equal_the_ragged_one(name, build_cache, rng):
    """The same keys as a ragged view and as page pools of 1 to 256 rows a page (NHD and HND, pages in random
    order): a tile holds the same values whichever way it was copied (gathered by rows, or by bulk copies of a
    tile, or of a page where a page is a box), so each template's output over a pool is the ragged one's, bit for
    bit (the same plan decisions: the same lengths). A prompt of 8192 rows takes the Hopper template's wide
    tiling (176 keys a tile) over ragged K/V and pages of 16 (boxes of 16 rows either way); over pages of 64 and 128
    a variant with both tilings (causal) keeps the 128-key one, whose boxes are a page or a tile (csrc/hopper_tma.cuh
    paged_boxes_kept), so that those two equal each other bit for bit and the wide ragged output to rounding; a
    variant with the wide tiling alone (vanilla) fills its tiles over them by boxes of 16 rows."""
    import torch

    att = cuda_module(name, build_cache, (128,), ("bfloat16",), ("prefill",))
    hopper = ["hopper"] if torch.cuda.get_device_capability()[0] == 9 else []
    _check_pools_equal_ragged(att, [200, 7, 0], [5000, 700, 64], (1, 8, 16, 32, 64, 128, 256), ("NHD", "HND"),
                              ["mma_sync"] + hopper, rng, seed=5)
    _check_pools_equal_ragged(att, [8192], [8192], (16, 64, 128), ("NHD",), hopper, rng, seed=6,
                              other_tiling=(64, 128) if name == "causal" else ())


def _check_pools_equal_ragged(att, qo_lens, kv_lens, pages, layouts, templates, rng, *, seed, other_tiling=()):
    """Each template's prefill over page pools of ``pages`` rows a page (``layouts``) equals, bit for bit, its
    prefill over the same keys as a ragged view (Hq 32 / Hkv 8, D 128, bf16). Pages in ``other_tiling`` run
    another tiling than the ragged view: their outputs equal each other's bit for bit, differ from the ragged one's
    (another summation order) and match it to two bf16 rounding steps."""
    import torch

    from attngen.runtime import RaggedKV

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(sum(qo_lens), 32, 128, device="cuda", generator=g).bfloat16()
    k = torch.randn(sum(kv_lens), 8, 128, device="cuda", generator=g).bfloat16()
    v = torch.randn(sum(kv_lens), 8, 128, device="cuda", generator=g).bfloat16()
    qo = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32, device="cuda")
    kv_ind = np.concatenate([[0], np.cumsum(kv_lens)])
    ragged = RaggedKV(k, v, torch.tensor(kv_ind, dtype=torch.int32, device="cuda"))
    for template in templates:
        ref = att.prefill(q, ragged, qo, plan=att.plan_prefill(qo, ragged, 128, template=template))
        other = None  # the first output of the other tiling
        for page in pages:
            for layout in layouts:
                paged = paged_copy(k, v, kv_ind, page, layout, rng)
                out = torch.full_like(q, float("nan"))
                lse = torch.full(q.shape[:2], float("nan"), device="cuda")
                att.prefill(q, paged, qo, plan=att.plan_prefill(qo, paged, 128, template=template), out=out, lse=lse)
                where = (template, page, layout, qo_lens)
                if page not in other_tiling:
                    assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1]), where
                    continue
                assert not torch.equal(out, ref[0]), where
                torch.testing.assert_close(out.float(), ref[0].float(), atol=2 ** -7, rtol=2 ** -7, msg=str(where))
                torch.testing.assert_close(lse, ref[1], atol=1e-3, rtol=0, msg=str(where))
                if other is None:
                    other = (out, lse)
                assert torch.equal(out, other[0]) and torch.equal(lse, other[1]), where


# (sigmoid: a sum state, merged without rescales; attention_sink: an output hook, whose rows reuse the shared
# memory the merge's flag lay in)
@pytest.mark.parametrize("name", ["causal", "vanilla", "sliding_window_causal", "sigmoid", "attention_sink"])
def test_mma_sync_appends_split_their_keys_into_chunks(name, build_cache, rng):
    """Appends of a few query rows over many keys give the mma.sync template no more CTAs than SMs: the plan
    cuts every item's keys into chunks over grid.y, each chunk's state merged in the kernel by the CTA finishing the
    item's last (runtime/mma_split.py). Against the float64 reference, paged with random page order and ragged, a
    request of no rows among them, with the split and without; one plan's two calls give the same bits."""
    import torch

    att = cuda_module(name, build_cache, (128,), ("bfloat16",), ("prefill",))
    v = variant(name)
    for kv_mode, qo_lens, kv_lens in [("NHD", [8], [8192]), ("ragged", [3, 16, 0, 5], [2000, 6000, 40, 5]),
                                      ("HND", [13], [9000])]:
        plans = []  # (64-row tiles: the split plan, then the unsplit one; the same with wide tiles asked for)
        run_prefill(att, v, rng, group=4, head_dim=128, dtype="bfloat16", kv_mode=kv_mode, qo_lens=qo_lens,
                    kv_lens=kv_lens, num_kv=4, plans=plans, tail_split=(None, False))
        for split, plan in zip((True, False, True, False), plans):
            made = [o for key, o in plan.orders.items() if key[0] == "mma"]
            assert (len(made) == 1 and made[0] is not None) == split, (kv_mode, split)
    q, kv, qo = one_ragged_request(8, 8192, 16, 4, 128, seed=3)
    params = one_request_params(v, rng, 8, 8192)
    plan = att.plan_prefill(qo, kv, 128, template="mma_sync")
    runs = []
    for i in range(2):
        if i:  # the kernel split: every chunk's slot written again (NaN between the calls; 8 x 4 rows: no CTA idle)
            (sec,) = [o for key, o in plan.orders.items() if key[0] == "mma"]
            pairs = mma_split.order_pairs(8, 4, 1)
            slots = sec[pairs + int(sec[pairs + 6]):].view(torch.float32)
            assert slots.numel() == int(sec[pairs + 3]) * int(sec[pairs + 1]) * mma_split.slot_floats(128)
            slots.fill_(float("nan"))
        out = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:2], float("nan"), device="cuda")
        runs.append(att.prefill(q, kv, qo, plan=plan, params=params, out=out, lse=lse))
    assert not slots.isnan().any()
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


def test_mma_sync_splits_long_appends_at_head_dim_256(build_cache, rng):
    """At head dim 256 the mma.sync template has 64-row tiles only: an append of 64 tokens at GQA 4 (256 packed
    rows) over 9000 keys splits its keys too (runtime/mma_split.py), against the float64 reference, paged in random
    page order and ragged, with the split and without."""
    att = cuda_module("causal", build_cache, (256,), ("bfloat16",), ("prefill",))
    v = variant("causal")
    for kv_mode in ("NHD", "ragged"):
        plans = []
        run_prefill(att, v, rng, group=4, head_dim=256, dtype="bfloat16", kv_mode=kv_mode, qo_lens=[64, 3],
                    kv_lens=[9000, 700], num_kv=4, plans=plans, tail_split=(None, False))
        for split, plan in zip((True, False, True, False), plans):
            made = [o for key, o in plan.orders.items() if key[0] == "mma"]
            assert (len(made) == 1 and made[0] is not None) == split, (kv_mode, split)


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("cap", [2.0, 30.0, 50.0, 100.0])
def test_softcap_row_max_fixed_or_running(template, cap, build_cache, rng):
    """Soft-cap's logits lie in [-cap, cap] (in log2 units cap * log2 e): on either template a bf16 warp whose
    bound is at most 80 fixes its rows' max at 0 instead of taking one (csrc/score_rules.cuh fixed_max_rows; caps
    2, 30 and Gemma 2's 50), a larger cap (100) keeps the running max; against the float64 reference, ragged
    and paged, with odd lengths, a request of no queries, and causal masks (checked tiles after a fixed max),
    scores from saturated (cap 2) to small against the bound (cap 100)."""
    skip_unless_runs(template)
    import runpy

    from attngen.runtime import CUDAAttention

    gemma = runpy.run_path(str(EXAMPLES / "gemma2_softcap_window.py"))["variant"]  # (causal, window 100 here)
    cases = [(cuda_module("logits_softcap", build_cache, (128,), ("bfloat16",), ("prefill",)),
              variant("logits_softcap"), {"soft_cap": cap}),
             (CUDAAttention.build(gemma, head_dims=(128,), dtypes=("bfloat16",), kernels=("prefill",),
                                  cache=build_cache), gemma, {"soft_cap": cap, "window_left": 100})]
    for att, v, params in cases:
        for kv_mode in ("ragged", "HND"):
            run_prefill(att, v, rng, group=4, head_dim=128, dtype="bfloat16", kv_mode=kv_mode, qo_lens=[300, 0, 77],
                        kv_lens=[700, 5, 77], template=template, make_params=lambda *_, p=params: dict(p))


@pytest.mark.parametrize("name,head_dim", [("causal", 128), ("sliding_window_causal", 128), ("causal", 64)])
def test_long_rows_on_both_hopper_tilings(name, head_dim, build_cache, rng):
    """At head_dim 64 and 128 a variant whose mask hook is exactly its bounds has both Hopper tilings: a call whose
    longest request has kHopperWideRows (8192) query rows or more takes the wide one (176 keys at 128, 192 at 64;
    csrc/hopper_launch.cuh; not over pages whose boxes it would shrink: paged_boxes_kept), with its short requests
    in the same launch; against the float64 reference (shorter calls, the 128-key tiling, are every other prefill
    test's) on the first, a middle and the last 256 rows of the long requests (causal_slices: a reference of every
    row took two minutes on the host)."""
    skip_unless_runs("hopper")
    att = cuda_module(name, build_cache, (head_dim,), ("bfloat16",), ("prefill",))
    v = variant(name)
    run_prefill(att, v, rng, group=2, head_dim=head_dim, dtype="bfloat16", kv_mode="NHD", qo_lens=[8200, 0, 300],
                kv_lens=[8200, 9, 900], template="hopper", ref_rows=256)
    run_prefill(att, v, rng, group=2, head_dim=head_dim, dtype="bfloat16", kv_mode="ragged", qo_lens=[8192, 5],
                kv_lens=[9000, 5], template="hopper", ref_rows=256)


@pytest.mark.parametrize("head_dim,chosen", [(64, "hopper"), (128, "hopper"), (256, "hopper")])
def test_auto_template_choice_on_sm90(head_dim, chosen, build_cache):
    """On a compute-capability-9.0 device the library's choice is the template measured faster for the head
    dim (csrc/prefill_dispatch.h): a plan left to the library gives that template's output bit for bit."""
    import torch

    skip_unless_runs("hopper")
    att = cuda_module("vanilla", build_cache, (head_dim,), ("bfloat16",), ("prefill",))
    q, kv, qo = one_ragged_request(300, 500, 8, 2, head_dim, seed=0)
    outs = {}
    for template in (None, "hopper", "mma_sync"):
        plan = att.plan_prefill(qo, kv, head_dim, template=template)
        outs[template] = att.prefill(q, kv, qo, plan=plan)[0]
    assert torch.equal(outs[None], outs[chosen])
    assert not torch.equal(outs["hopper"], outs["mma_sync"])  # a different summation order


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("example", ["gemma2_softcap_window", "prefix_lm", "document_mask"])
def test_example_variants(example, template, build_cache, rng):
    """The README's variant examples (soft-cap + sliding window, prefix-LM and packed documents from tensor
    parameters) on both templates, with the example's own parameter maker."""
    import runpy

    from attngen.runtime import CUDAAttention

    skip_unless_runs(template)
    module = runpy.run_path(str(EXAMPLES / f"{example}.py"))
    v = module["variant"]
    att = CUDAAttention.build(v, head_dims=(128,), dtypes=("bfloat16",), kernels=("prefill",), cache=build_cache)
    make = next((f for name, f in module.items() if name in ("prefix_lengths", "packed_documents")), random_params)
    for group, kv_mode in [(1, "ragged"), (4, "NHD"), (8, "HND")]:
        run_prefill(att, v, rng, group=group, head_dim=128, dtype="bfloat16", kv_mode=kv_mode,
                    qo_lens=[37, 0, 100, 3, 300], kv_lens=[37, 5, 180, 0, 300], template=template, make_params=make)


def _captured(call):
    """A CUDA graph of call(), run once eagerly first (the plan's first call makes its work order)."""
    import torch

    call()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


@pytest.mark.parametrize("template", TEMPLATES)
def test_prefill_cuda_graph_replays_100_random_batches(template, build_cache, rng):
    """Capture prefill once with a plan bounded by max_qo_len, then replay it for 100 random batches of the
    same size and total rows (query lengths, KV lengths, page tables) written into the captured tensors:
    bit-identical to eager runs of each batch's plan with the same bound, and within rounding of its
    exact plan (a grid sized by its own longest request)."""
    import torch

    from attngen.runtime import PagedKV

    skip_unless_runs(template)
    att = cuda_module("causal", build_cache, head_dims=(128,), dtypes=("float16",), kernels=("prefill",))
    batch, total, hq, hkv, d, num_pages = 5, 600, 16, 4, 128, 400
    pages = torch.randn(num_pages, 2, 16, hkv, d, dtype=torch.float16, device="cuda")
    q = torch.empty(total, hq, d, dtype=torch.float16, device="cuda")
    qo_indptr = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    indices = torch.zeros(num_pages, dtype=torch.int32, device="cuda")
    last = torch.ones(batch, dtype=torch.int32, device="cuda")
    kv = PagedKV(pages, indptr, indices, last)

    def refill():
        cuts = np.sort(rng.integers(0, total + 1, size=batch - 1))
        qo_lens = np.diff(np.concatenate([[0], cuts, [total]]))  # some may be 0
        kv_lens = qo_lens + rng.integers(0, 300, size=batch)
        n = (kv_lens + 15) // 16
        qo_indptr.copy_(torch.from_numpy(np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)))
        indptr.copy_(torch.from_numpy(np.concatenate([[0], np.cumsum(n)]).astype(np.int32)))
        indices.copy_(torch.from_numpy(rng.permutation(num_pages).astype(np.int32)))
        last.copy_(torch.from_numpy(np.where(n > 0, kv_lens - 16 * (n - 1), 1).astype(np.int32)))
        q.copy_(torch.randn(total, hq, d, dtype=torch.float16))
        return qo_lens

    refill()
    plan = att.plan_prefill(qo_indptr, kv, d, template=template, tile_map=False, max_qo_len=total)
    out = torch.empty_like(q)
    lse = torch.empty(total, hq, device="cuda")
    graph = _captured(lambda: att.prefill(q, kv, qo_indptr, plan=plan, out=out, lse=lse))
    longest = set()
    for _ in range(100):
        longest.add(int(refill().max()))
        out.fill_(float("nan"))
        graph.replay()
        bounded = att.plan_prefill(qo_indptr, kv, d, template=template, tile_map=False, max_qo_len=total)
        eager_o, eager_l = att.prefill(q, kv, qo_indptr, plan=bounded)
        exact_o, exact_l = att.prefill(q, kv, qo_indptr, plan=att.plan_prefill(qo_indptr, kv, d, template=template))
        torch.cuda.synchronize()
        assert torch.equal(out, eager_o) and torch.equal(lse, eager_l)
        # the bound changes only the grid (and on mma.sync perhaps the query tile), not what a row computes
        torch.testing.assert_close(out, exact_o, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(lse, exact_l, atol=1e-3, rtol=1e-4)
    assert len(longest) > 30  # the batches really changed


@pytest.mark.parametrize("template", TEMPLATES)
def test_a_replay_past_the_plans_bound_gives_nan_rows_not_stale_ones(template, build_cache):
    """A graph captured with a plan bounded below the total rows, replayed over a batch whose longest request
    passes the bound (the captured grid covers only the bound's query tiles): that request's rows come out NaN
    (out and lse) where the kernel alone would have left the rows past the bound as they were; the other
    requests match an exact plan's run; plan.check_replay refuses the batch on the host by name."""
    import torch

    from attngen.runtime import PagedKV
    from attngen.runtime.checks import AttentionArgumentError

    skip_unless_runs(template)
    att = cuda_module("causal", build_cache, head_dims=(128,), dtypes=("float16",), kernels=("prefill",))
    hq, hkv, d, total = 8, 2, 128, 700
    within, past = [300, 200, 200], [100, 100, 500]  # bound 300: 500 rows need 2+ more tiles than it gives
    kv_lens = [900, 900, 900]
    n = [(x + 15) // 16 for x in kv_lens]
    pages = torch.randn(sum(n), 2, 16, hkv, d, dtype=torch.float16, device="cuda")
    indices = torch.randperm(sum(n), dtype=torch.int32, device="cuda")
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(n)]), dtype=torch.int32, device="cuda")
    last = torch.tensor([x - 16 * (m - 1) for x, m in zip(kv_lens, n)], dtype=torch.int32, device="cuda")
    kv = PagedKV(pages, indptr, indices, last)
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(within)]), dtype=torch.int32, device="cuda")
    q = torch.randn(total, hq, d, dtype=torch.float16, device="cuda")
    plan = att.plan_prefill(qo_indptr, kv, d, template=template, tile_map=False, max_qo_len=300)
    out, lse = torch.empty_like(q), torch.empty(total, hq, device="cuda")
    graph = _captured(lambda: att.prefill(q, kv, qo_indptr, plan=plan, out=out, lse=lse))
    past_indptr = np.concatenate([[0], np.cumsum(past)]).astype(np.int32)
    with pytest.raises(AttentionArgumentError, match="request 2 has 500 query rows, past the plan's max_qo_len=300"):
        plan.check_replay(past_indptr)
    plan.check_replay(np.concatenate([[0], np.cumsum(within)]).astype(np.int32))
    qo_indptr.copy_(torch.from_numpy(past_indptr))
    out.zero_()
    lse.zero_()
    graph.replay()
    exact_o, exact_l = att.prefill(q, kv, qo_indptr, plan=att.plan_prefill(qo_indptr, kv, d, template=template))
    torch.cuda.synchronize()
    assert torch.isnan(out[200:]).all() and torch.isnan(lse[200:]).all()
    torch.testing.assert_close(out[:200], exact_o[:200], atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(lse[:200], exact_l[:200], atol=1e-3, rtol=1e-4)


@T.prim_func
def _signed_distance_bias(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                          kv_head: T.int32, w_ptr: T.handle, slope_ptr: T.handle) -> T.float32:
    n = T.int32()
    w = T.match_buffer(w_ptr, (n,), "float32")
    slope = T.match_buffer(slope_ptr, (n,), "float32")
    return s * w[qo_head] + slope[qo_head] * T.float32(kv_pos - qo_pos)


@pytest.mark.parametrize("template", TEMPLATES)
def test_affine_logits_hook_with_scales_of_either_sign(template, build_cache, rng):
    """An affine logits hook (codegen/logits_split.py) whose score factor is negative for some heads: warps
    whose rows all scale by a positive factor take the interior fast path (csrc/score_rules.cuh), the others
    the general one; long requests so that interior tiles exist, GQA groups mixing both kinds of rows."""
    from attngen.ir import TensorParam, Variant
    from attngen.runtime import CUDAAttention

    skip_unless_runs(template)
    v = Variant("signed_distance_bias", logits_transform=_signed_distance_bias,
                params=[TensorParam("w", "float32", ("num_qo_heads",)),
                        TensorParam("slope", "float32", ("num_qo_heads",))])
    att = CUDAAttention.build(v, head_dims=(128,), dtypes=("bfloat16",), kernels=("prefill",), cache=build_cache)

    def params(variant, rng_, problem):
        hq = problem.q.shape[1]
        w = rng_.uniform(0.3, 1.5, hq) * np.where(np.arange(hq) % 3 == 1, -1.0, 1.0)
        return {"w": w.astype("float32"), "slope": rng_.uniform(0.0, 0.1, hq).astype("float32")}

    for group, kv_mode in [(1, "ragged"), (4, "NHD"), (3, "HND")]:
        run_prefill(att, v, rng, group=group, head_dim=128, dtype="bfloat16", kv_mode=kv_mode,
                    qo_lens=[300, 0, 7, 129], kv_lens=[420, 3, 7, 700], template=template, make_params=params)
