"""The bound of a prefill plan made for CUDA-graph replays (``plan_prefill(..., max_qo_len=bound)``), kept
where the host cannot check it.

Such a plan sizes its launch by the bound, not by the planned batch: a graph captured with it replays any
batch of the same size and total query rows whose requests stay within the bound, written into the captured
index tensors. The host never sees a replayed batch, so a request longer than the bound would find no CTA for
its last query tiles, and its rows past the bound would keep whatever the output held: a silently wrong
answer. Two guards close that:

- ``check_replay_batch`` (``PrefillPlan.check_replay``): the host check for the batch about to be written
  into the captured tensors, with an error naming the bound;
- ``poison_rows_over_bound``: captured with the prefill itself (a few small device operations, no host
  synchronisation), it sets every output row and lse of a request longer than the bound to NaN, so that a
  replay past the bound is loud. Plans whose bound reaches the batch's total rows (no request can pass it)
  skip it.
"""
from __future__ import annotations

import numpy as np

from .checks import AttentionArgumentError, as_numpy


def check_replay_batch(qo_indptr, *, batch_size: int, total_q: int, max_qo_len: int) -> None:
    """Refuse, naming the bound, a batch (qo_indptr [B+1], host or device) that a graph captured with a plan of
    ``batch_size`` requests, ``total_q`` query rows and bound ``max_qo_len`` cannot replay."""
    qo = np.asarray(as_numpy(qo_indptr, "qo_indptr"), dtype=np.int64)
    if qo.ndim != 1 or len(qo) != batch_size + 1:
        raise AttentionArgumentError(f"qo_indptr: has {qo.size} entries; the plan's graph replays batches of "
                                     f"{batch_size} requests ({batch_size + 1} entries)")
    if qo[0] != 0 or np.any(np.diff(qo) < 0):
        raise AttentionArgumentError("qo_indptr: must start at 0 and be non-decreasing")
    if int(qo[-1]) != total_q:
        raise AttentionArgumentError(f"qo_indptr: {int(qo[-1])} query rows; the plan's graph replays batches of "
                                     f"{total_q} rows")
    lens = np.diff(qo)
    if len(lens) and int(lens.max()) > max_qo_len:
        b = int(lens.argmax())
        raise AttentionArgumentError(
            f"qo_indptr: request {b} has {int(lens[b])} query rows, past the plan's max_qo_len={max_qo_len}: "
            f"capture a graph with a plan of a larger max_qo_len (up to the {total_q} total rows)")


def poison_rows_over_bound(out, lse, qo_indptr, rows, *, max_qo_len: int) -> None:
    """out [total_q, Hq, D] and lse [total_q, Hq] (torch, CUDA): NaN in every row of a request of qo_indptr
    [B+1] (int32, the same device) longer than ``max_qo_len``, by device operations only (capturable). rows:
    int32 [total_q] 0, 1, ... on that device (the plan's, made once: ``PrefillPlan.replay_rows``)."""
    import torch

    if rows.numel() == 0 or qo_indptr.numel() < 2:
        return
    request = torch.searchsorted(qo_indptr, rows, right=True) - 1  # [total_q] each row's request
    too_long = (qo_indptr[1:] - qo_indptr[:-1]) > max_qo_len  # [B]
    over = too_long[request.clamp_(0, too_long.numel() - 1)]  # [total_q]
    out.masked_fill_(over[:, None, None], float("nan"))
    lse.masked_fill_(over[:, None], float("nan"))
