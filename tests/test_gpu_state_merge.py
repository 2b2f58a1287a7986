"""GPU: the CUDA state-merge kernels agree with the CPU backend and keep the empty-state rule."""
import pytest

from attngen.runtime import merge_state, merge_states, merge_states_sum

from .test_state_merge import masked_merge_checked

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128, 96])
def test_cuda_merge_matches_cpu(dtype, head_dim, rng):
    import torch

    n, k, h = 7, 5, 3
    v = torch.randn(n, k, h, head_dim)
    s = torch.randn(n, k, h) * 4
    s[rng.random((n, k, h)) < 0.3] = float("-inf")
    v[torch.isinf(s)] = 0
    s[0] = float("-inf")  # a row whose states are all empty
    v[0] = 0
    t = getattr(torch, dtype)
    got_v, got_s = merge_states(v.to(t).cuda(), s.cuda())
    want_v, want_s = merge_states(v.to(t).float(), s)  # CPU backend on the same rounded inputs
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    assert torch.allclose(got_v.float().cpu(), want_v, atol=tol)
    assert torch.equal(torch.isinf(got_s.cpu()), torch.isinf(want_s))
    assert torch.allclose(got_s.cpu().nan_to_num(neginf=0), want_s.nan_to_num(neginf=0), atol=1e-5)
    assert not torch.isnan(got_v).any() and torch.all(got_v[0] == 0)
    a_v, a_s = v[:, 0].to(t).cuda().contiguous(), s[:, 0].cuda().contiguous()
    merge_state(a_v, a_s, v[:, 1].to(t).cuda().contiguous(), s[:, 1].cuda().contiguous())
    c_v, c_s = v[:, 0].to(t).float().contiguous(), s[:, 0].contiguous()
    merge_state(c_v, c_s, v[:, 1].to(t).float().contiguous(), s[:, 1].contiguous())
    assert torch.allclose(a_v.float().cpu(), c_v, atol=tol)
    assert torch.allclose(merge_states_sum(v.to(t).cuda()).float().cpu(), v.to(t).float().sum(1), atol=10 * tol)


def test_cuda_merge_with_a_row_mask():
    """The mask on CUDA tensors: flagged rows as the unmasked merge, the others untouched bit for bit."""
    import torch

    n, h, d = 9, 4, 128
    v, vo = torch.randn(n, h, d, device="cuda").half(), torch.randn(n, h, d, device="cuda").half()
    s, so = torch.randn(n, h, device="cuda") * 4, torch.randn(n, h, device="cuda") * 4
    vo[2], so[2] = float("nan"), float("inf")
    mask = torch.tensor([1, 0, 0, 1, 1, 0, 1, 0, 1], dtype=torch.bool, device="cuda")
    masked_merge_checked(v, s, vo, so, mask)
