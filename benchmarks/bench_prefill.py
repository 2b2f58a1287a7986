"""Single-request causal prefill benchmark: attngen's fa2 template vs FlashInfer fa2 vs PyTorch SDPA.

bf16, D 128, Hq 32 / Hkv 8, L 4k and 16k; ragged K/V of one request. Reports TFLOP/s
(causal FLOPs = 2 * 2 * L^2 / 2 * D * Hq) and the ratio to each peer.

    python benchmarks/bench_prefill.py --out benchmarks/results --commit <sha>
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch

from common import bench, write_results

CASES = [("causal L4k", 4096), ("causal L16k", 16384)]
HQ, HKV, D = 32, 8, 128


def make_case(L: int):
    """q [L, HQ, D], k / v [L, HKV, D] (bf16, random) and the indptr [2] of one request of L tokens."""
    q = torch.randn(L, HQ, D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(L, HKV, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(L, HKV, D, dtype=torch.bfloat16, device="cuda")
    return q, k, v, torch.tensor([0, L], dtype=torch.int32, device="cuda")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    from attngen.runtime import CUDAAttention, RaggedKV
    from attngen.variants import builtin

    att = CUDAAttention.build(builtin("causal"), head_dims=(D,), dtypes=("bfloat16",), layouts=("NHD",))
    try:
        import flashinfer
    except Exception:  # noqa: BLE001
        flashinfer = None
    res = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "commit": args.commit,
           "cases": []}
    for name, L in CASES:
        q, k, v, indptr = make_case(L)
        kv = RaggedKV(k, v, indptr)
        plan = att.plan_prefill(indptr, kv, D)
        out = torch.empty_like(q)
        lse = torch.empty(L, HQ, device="cuda")
        flops = 2 * 2 * L * L / 2 * D * HQ
        row = {"case": name, "attngen_ms": bench(lambda: att.prefill(q, kv, indptr, plan=plan, out=out, lse=lse),
                                                 reps=20)}
        narrow = att.plan_prefill(indptr, kv, D, wide_tiles=False)  # the 64-row tiles, for comparison
        out_narrow = torch.empty_like(q)
        row["attngen_64row_ms"] = bench(lambda: att.prefill(q, kv, indptr, plan=narrow, out=out_narrow, lse=lse),
                                        reps=20)
        row["attngen_64row_maxdiff"] = float((out_narrow.float() - out.float()).abs().max())
        if flashinfer is not None:
            try:
                fi = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, backend="fa2")
                row["flashinfer_fa2_ms"] = bench(lambda: flashinfer.single_prefill_with_kv_cache(
                    q, k, v, causal=True, backend="fa2"), reps=20)
                row["flashinfer_maxdiff"] = float((fi.float() - out.float()).abs().max())
            except Exception as e:  # noqa: BLE001
                row["flashinfer_error"] = str(e)[:300]
        qs, ks, vs = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
        row["sdpa_ms"] = bench(lambda: torch.nn.functional.scaled_dot_product_attention(
            qs, ks, vs, is_causal=True, enable_gqa=True), reps=20)
        for key in [x for x in list(row) if x.endswith("_ms")]:
            row[key.replace("_ms", "_TFLOPs")] = flops / (row[key] * 1e-3) / 1e12
        res["cases"].append(row)
        print(json.dumps(row), flush=True)
    lines = [f"# Single-request causal prefill, bf16, D {D}, Hq {HQ} / Hkv {HKV} — {res['gpu']}, {res['date']}, "
             f"commit {res['commit']}", "", "TFLOP/s (causal FLOPs); device time with the host ahead of the GPU.", "",
             "| case | attngen | attngen 64-row tiles | FlashInfer fa2 | SDPA | attngen / FI fa2 |", "|---|---|---|---|---|---|"]
    for r in res["cases"]:
        f = [r.get(k) for k in ("attngen_TFLOPs", "attngen_64row_TFLOPs", "flashinfer_fa2_TFLOPs", "sdpa_TFLOPs")]
        ratio = f[0] / f[2] if f[0] and f[2] else float("nan")
        lines.append(f"| {r['case']} | " + " | ".join(f"{x:.0f}" if x else "—" for x in f) + f" | {ratio:.2f} |")
    write_results(args.out, f"prefill_{res['date']}", res, lines)


if __name__ == "__main__":
    main()
