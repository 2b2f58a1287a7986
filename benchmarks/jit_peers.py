"""Compiles FlashInfer's JIT modules for bench_prefill.py's cases, or bench_variants.py's peers, ahead of the
timed run, one process per module in parallel (each takes a minute or more to build), so that the benchmark
itself only loads them (a fresh machine otherwise spends about five minutes of a variants run in these builds).

    python benchmarks/jit_peers.py [CASE_PREFIX,...]   # bench_prefill's cases (default: all), fa2 and fa3
    python benchmarks/jit_peers.py --variants          # bench_variants' soft-cap / window / RoPE peers
"""
from __future__ import annotations

import subprocess
import sys

from bench_prefill import CASES


ROWS = 256  # query and key rows of a warm-up call


def qkv(d: int, dtype: str, hq: int, hkv: int):
    """Random q [ROWS, hq, d], k and v [ROWS, hkv, d] on the GPU, of the named torch dtype."""
    import torch

    dt = getattr(torch, dtype)
    return (torch.randn(ROWS, hq, d, dtype=dt, device="cuda"), torch.randn(ROWS, hkv, d, dtype=dt, device="cuda"),
            torch.randn(ROWS, hkv, d, dtype=dt, device="cuda"))


def warm(d: int, dtype: str, hq: int, hkv: int, batch: bool, backend: str) -> None:
    import torch

    import flashinfer as fi

    dt = getattr(torch, dtype)
    n = ROWS
    q, k, v = qkv(d, dtype, hq, hkv)
    if not batch:
        fi.single_prefill_with_kv_cache(q, k, v, causal=True, backend=backend)
        return
    indptr = torch.tensor([0, 100, n], dtype=torch.int32, device="cuda")
    ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
    w.plan(indptr, indptr, hq, hkv, d, causal=True, q_data_type=dt)
    w.run(q, k, v)


def warm_variant(cap: float, window: int, rope: bool, backend: str) -> None:
    """One single-prefill module as bench_variants calls it (bf16, its head counts and head dim)."""
    import flashinfer as fi
    from bench_variants import D, HKV, HQ, ROPE

    q, k, v = qkv(D, "bfloat16", HQ, HKV)
    if rope:
        fi.single_prefill_with_kv_cache(q, k, v, pos_encoding_mode="ROPE_LLAMA", **ROPE, backend=backend)
    else:
        fi.single_prefill_with_kv_cache(q, k, v, causal=window >= 0, logits_soft_cap=cap or None,
                                        window_left=window, backend=backend)


def variant_specs() -> list[tuple]:
    """(cap, window, rope, backend) of every FlashInfer call bench_variants makes."""
    from bench_variants import GEMMA_CAP, GEMMA_WINDOW, SOFT_CAP, WINDOW

    shapes = [(0.0, -1), (SOFT_CAP, -1), (0.0, WINDOW), (GEMMA_CAP, GEMMA_WINDOW)]
    return [(cap, w, 0, b) for cap, w in shapes for b in ("fa2", "fa3")] + [(0.0, -1, 1, "fa2")]


def build_all(args: list[list[str]]) -> None:
    """Runs this file once per argument list, all at once, and reports each."""
    procs = [(a, subprocess.Popen([sys.executable, __file__, *a], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)) for a in args]
    for a, p in procs:
        out, _ = p.communicate()
        print(a, "ok" if p.returncode == 0 else f"failed: {out[-300:]}", flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--variant"]:
        cap, window, rope, backend = sys.argv[2:]
        warm_variant(float(cap), int(window), rope == "1", backend)
        return
    if sys.argv[1:] == ["--variants"]:
        build_all([["--variant", *map(str, s)] for s in variant_specs()])
        return
    if len(sys.argv) > 2:
        d, dtype, hq, hkv, batch, backend = sys.argv[1:]
        warm(int(d), dtype, int(hq), int(hkv), batch == "1", backend)
        return
    wanted = sys.argv[1].split(",") if len(sys.argv) == 2 else None
    cases = [c for c in CASES if wanted is None or any(c.name.startswith(p) for p in wanted)]
    specs = sorted({(c.d, c.dtype, c.hq, c.hkv, int(len(c.qo_lens) > 1), b) for c in cases for b in ("fa2", "fa3")})
    build_all([list(map(str, s)) for s in specs])


if __name__ == "__main__":
    main()
