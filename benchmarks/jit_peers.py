"""Compiles FlashInfer's JIT modules for bench_prefill.py's cases ahead of the timed run, one process per
module in parallel (each takes a minute or more to build), so that the benchmark itself only loads them.

    python benchmarks/jit_peers.py [CASE_PREFIX,...]   # bench_prefill's cases (default: all), fa2 and fa3
"""
from __future__ import annotations

import subprocess
import sys

from bench_prefill import CASES


def warm(d: int, dtype: str, hq: int, hkv: int, batch: bool, backend: str) -> None:
    import torch

    import flashinfer as fi

    dt = getattr(torch, dtype)
    n = 256
    q = torch.randn(n, hq, d, dtype=dt, device="cuda")
    k = torch.randn(n, hkv, d, dtype=dt, device="cuda")
    v = torch.randn(n, hkv, d, dtype=dt, device="cuda")
    if not batch:
        fi.single_prefill_with_kv_cache(q, k, v, causal=True, backend=backend)
        return
    indptr = torch.tensor([0, 100, n], dtype=torch.int32, device="cuda")
    ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
    w.plan(indptr, indptr, hq, hkv, d, causal=True, q_data_type=dt)
    w.run(q, k, v)


def main() -> None:
    if len(sys.argv) > 2:
        d, dtype, hq, hkv, batch, backend = sys.argv[1:]
        warm(int(d), dtype, int(hq), int(hkv), batch == "1", backend)
        return
    wanted = sys.argv[1].split(",") if len(sys.argv) == 2 else None
    cases = [c for c in CASES if wanted is None or any(c.name.startswith(p) for p in wanted)]
    specs = sorted({(c.d, c.dtype, c.hq, c.hkv, int(len(c.qo_lens) > 1), b) for c in cases for b in ("fa2", "fa3")})
    procs = [(s, subprocess.Popen([sys.executable, __file__, *map(str, s)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)) for s in specs]
    for s, p in procs:
        out, _ = p.communicate()
        print(s, "ok" if p.returncode == 0 else f"failed: {out[-300:]}", flush=True)


if __name__ == "__main__":
    main()
