"""Verify-step appends on the Hopper template, timed alone: B1 q8 kv8k and B1 q4 kv2k (bf16, Hq 32 / Hkv 8, D 128,
causal), over pages of 16 in random order and over ragged K/V, through the tail split (the keys cut into pieces
whose partial states the last piece merges: csrc/hopper_tail.cuh). Prints the median of three rounds of
common.bench (30 repetitions each, device time, the host ahead) per case and K/V form. For A/B runs of source
trees: run it from each tree with its own ATTNGEN_CACHE_DIR.

    PYTHONPATH=. python benchmarks/probe_verify_tail.py
"""
from __future__ import annotations

import numpy as np
import torch

import bench_append as ba
from common import bench


def main() -> None:
    from attngen.runtime import CUDAAttention, PagedKV, RaggedKV
    from attngen.variants import builtin

    att = CUDAAttention.build(builtin("causal"), head_dims=(128,), dtypes=("bfloat16",), kernels=("prefill",))
    rng = np.random.default_rng(0)
    for case in (ba.Case("verify B1 q8 kv8k", 1, 8, 8192), ba.Case("verify B1 q4 kv2k", 1, 4, 2048)):
        q, cache, pind, order, last, qind = ba.make_inputs(case, rng)
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:2], device=q.device)
        rows = order.long()
        k = cache[rows, 0].reshape(-1, ba.HKV, ba.D)[: case.kv_len].contiguous()  # [kv_len, Hkv, D]
        v = cache[rows, 1].reshape(-1, ba.HKV, ba.D)[: case.kv_len].contiguous()
        kv_indptr = torch.tensor([0, case.kv_len], dtype=torch.int32, device="cuda")
        calls = {}
        for name, kv in (("p16", PagedKV(cache, pind, order, last, "NHD")), ("ragged", RaggedKV(k, v, kv_indptr))):
            plan = att.plan_prefill(qind, kv, ba.D, template="hopper")
            calls[name] = (lambda p, kv: lambda: att.prefill(q, kv, qind, plan=p, out=out, lse=lse))(plan, kv)
            calls[name]()
        times = {name: [] for name in calls}
        for _ in range(3):
            for name, call in calls.items():
                times[name].append(bench(call, reps=30) * 1e3)
        for name, ts in times.items():
            print(f"{case.name} {name:7s} {sorted(ts)[1]:8.2f} us  all={[round(t, 2) for t in ts]}", flush=True)


if __name__ == "__main__":
    main()
