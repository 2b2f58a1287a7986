"""Timing helpers shared by the benchmark scripts: CUDA-event medians and the copy-bandwidth ceiling."""
from __future__ import annotations

import numpy as np
import torch


def bench(fn, reps=50, warmup=10) -> float:
    """Median milliseconds of ``fn`` over ``reps`` launches timed with CUDA events, after warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def copy_bandwidth() -> float:
    """GB/s of a 2 GiB device-to-device copy on this GPU (read + write bytes)."""
    x = torch.empty(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x), reps=20)
    return 2 * x.numel() * 2 / (ms * 1e-3) / 1e9
