"""GPU: the row-hook pass (csrc/hook_pass.cuh) — a variant's key / query transforms applied once per row
ahead of the prefill — against the float64 reference and against the kernels' per-tile hooks (to rounding:
the hook's float math may contract into FMAs differently in the two kernels).

Both templates, ragged and paged (NHD, HND) views with random page permutations, empty and odd-length
requests, element-wise (rope) and whole-row (whole_row_hooks) hooks, and a workspace one byte short refused
by name.
"""
import numpy as np
import pytest

from .test_gpu_decode import cuda_module, variant
from .test_gpu_prefill import TEMPLATES, run_prefill, skip_unless_runs

pytestmark = pytest.mark.gpu

CASES = [("rope", 128, "bfloat16"), ("rope", 64, "float16"), ("rope", 256, "bfloat16"),
         ("whole_row_hooks", 128, "float16")]


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("name,head_dim,dtype", CASES)
def test_hook_pass_matches_reference_and_the_per_tile_hooks(name, head_dim, dtype, template, build_cache):
    skip_unless_runs(template)
    import torch

    att = cuda_module(name, build_cache, (head_dim,), (dtype,), ("prefill",))
    v = variant(name)
    for seed, (group, kv_mode) in enumerate([(1, "ragged"), (4, "NHD"), (8, "HND"), (4, "ragged")]):
        outs = {}
        for hook_pass in (True, False):  # the same inputs (one seed) either way
            outs[hook_pass] = []
            run_prefill(att, v, np.random.default_rng(100 + seed), group=group, head_dim=head_dim, dtype=dtype,
                        kv_mode=kv_mode, qo_lens=[37, 0, 300, 3, 1], kv_lens=[37, 5, 420, 0, 70],
                        template=template, hook_pass=hook_pass, outputs=outs[hook_pass])
        for (o1, l1), (o2, l2) in zip(outs[True], outs[False]):  # (both met the reference in run_prefill)
            assert torch.allclose(o1.float(), o2.float(), atol=2e-2, rtol=2e-2) and \
                torch.allclose(l1, l2, atol=2e-2), f"{name} {template} {kv_mode} g{group}: pass and per-tile differ"


def test_hook_pass_workspace_is_checked(build_cache, monkeypatch):
    """A workspace one byte shorter than the pass needs is refused by name; the automatic choice skips the pass
    for one short request and applies it for a long one (same output either way)."""
    import torch

    from attngen.runtime import RaggedKV
    from attngen.runtime import hook_pass as hook_pass_module

    att = cuda_module("rope", build_cache, (128,), ("bfloat16",), ("prefill",))
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(200, 8, 128, device="cuda", generator=g).bfloat16()
    k = torch.randn(200, 2, 128, device="cuda", generator=g).bfloat16()
    vv = torch.randn(200, 2, 128, device="cuda", generator=g).bfloat16()
    qo = torch.tensor([0, 200], dtype=torch.int32, device="cuda")
    kv = RaggedKV(k, vv, torch.tensor([0, 200], dtype=torch.int32, device="cuda"))
    params = {"rope_scale": 1.0, "rope_theta": 1e4}
    auto = att.plan_prefill(qo, kv, 128)
    assert hook_pass_module.wanted(att.variant, auto.hook_pass, auto.max_qo_len * 4)
    short = hook_pass_module.workspace_bytes(att.variant, q, kv, 128) - 1
    monkeypatch.setattr(hook_pass_module, "workspace_bytes", lambda *a: short)
    with pytest.raises(ValueError, match=rf"hook_workspace: {short} bytes, the row-hook pass of this call needs "
                                         rf"{short + 1}"):
        att.prefill(q, kv, qo, plan=att.plan_prefill(qo, kv, 128, hook_pass=True), params=params)
    monkeypatch.undo()
    with_pass, _ = att.prefill(q, kv, qo, plan=auto, params=params)
    without, _ = att.prefill(q, kv, qo, plan=att.plan_prefill(qo, kv, 128, hook_pass=False), params=params)
    assert torch.allclose(with_pass.float(), without.float(), atol=2e-2, rtol=2e-2)
    one = torch.tensor([0, 8], dtype=torch.int32, device="cuda")  # 8 tokens x 4 heads: below AUTO_MIN_ROWS
    assert not hook_pass_module.wanted(att.variant, None, att.plan_prefill(one, kv, 128).max_qo_len * 4)
