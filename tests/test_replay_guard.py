"""The guards of prefill plans made for CUDA-graph replays (runtime/replay_guard.py): the host check of a batch
about to be replayed, and the device-side poisoning of requests past the bound (run here on CPU tensors: the
same torch operations)."""
import numpy as np
import pytest
import torch

from attngen.runtime.checks import AttentionArgumentError
from attngen.runtime.replay_guard import check_replay_batch, poison_rows_over_bound


def test_a_batch_within_the_bound_passes_and_one_past_it_is_refused_by_name():
    check_replay_batch(np.array([0, 3, 3, 10], np.int32), batch_size=3, total_q=10, max_qo_len=7)
    with pytest.raises(AttentionArgumentError, match=r"request 2 has 8 query rows, past the plan's max_qo_len=7"):
        check_replay_batch(np.array([0, 2, 2, 10], np.int32), batch_size=3, total_q=10, max_qo_len=7)
    with pytest.raises(AttentionArgumentError, match="batches of 3 requests"):
        check_replay_batch(np.array([0, 5, 10], np.int32), batch_size=3, total_q=10, max_qo_len=7)
    with pytest.raises(AttentionArgumentError, match="11 query rows; the plan's graph replays batches of 10 rows"):
        check_replay_batch(torch.tensor([0, 4, 4, 11], dtype=torch.int32), batch_size=3, total_q=10, max_qo_len=7)
    with pytest.raises(AttentionArgumentError, match="non-decreasing"):
        check_replay_batch(np.array([0, 6, 4, 10], np.int32), batch_size=3, total_q=10, max_qo_len=7)


@pytest.mark.parametrize("seed", range(5))
def test_poisoning_sets_exactly_the_rows_of_requests_past_the_bound(seed):
    rng = np.random.default_rng(seed)
    batch, total = 6, 90
    cuts = np.sort(rng.integers(0, total + 1, size=batch - 1))
    lens = np.diff(np.concatenate([[0], cuts, [total]]))
    bound = int(lens.max()) - 1 - seed % 3  # the longest request, at least, past it
    qo = torch.from_numpy(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    out = torch.randn(total, 4, 8)
    lse = torch.randn(total, 4)
    keep_o, keep_l = out.clone(), lse.clone()
    poison_rows_over_bound(out, lse, qo, torch.arange(total, dtype=torch.int32), max_qo_len=bound)
    over = np.repeat(lens > bound, lens)
    assert over.any() and not over.all()
    assert torch.isnan(out[torch.from_numpy(over)]).all() and torch.isnan(lse[torch.from_numpy(over)]).all()
    assert torch.equal(out[torch.from_numpy(~over)], keep_o[torch.from_numpy(~over)])
    assert torch.equal(lse[torch.from_numpy(~over)], keep_l[torch.from_numpy(~over)])


def test_poisoning_an_empty_batch_changes_nothing():
    out, lse = torch.zeros(0, 2, 8), torch.zeros(0, 2)
    poison_rows_over_bound(out, lse, torch.zeros(1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32),
                           max_qo_len=1)
    assert out.shape == (0, 2, 8)


def test_a_plan_walking_a_tile_map_refuses_replays():
    from attngen.runtime.cuda_plans import PrefillPlan

    plan = PrefillPlan(2, 10, 7, (0, 0), tile_map=True, replay_bound=True)
    with pytest.raises(AttentionArgumentError, match="tile_map=False"):
        plan.check_replay(np.array([0, 3, 10], np.int32))
    PrefillPlan(2, 10, 7, (0, 0), replay_bound=True).check_replay(np.array([0, 3, 10], np.int32))
