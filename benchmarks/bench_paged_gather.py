"""What a paged K/V view costs the Hopper prefill: the same causal append (one request of qo_len rows over
kv_len keys) over ragged K/V and over page pools holding the same keys (pages of 16 and 64, in order and in random
order; pages of one row, as SGLang keeps its cache, in random order: gathered row by row, no boxes), bf16, Hq 32 /
Hkv 8, D 128. Microseconds per call and TFLOP/s of the visible work; every output compared
with the ragged one.

    python benchmarks/bench_paged_gather.py --out benchmarks/results --commit <sha> [--tag _x]
"""
from __future__ import annotations

import numpy as np
import torch

from common import result_parser, run_info, time_prefill, write_results

HQ, HKV, D = 32, 8, 128
CASES = [(2048, 16384), (512, 32768), (16384, 16384)]  # (qo_len, kv_len)
POOLS = [(16, False), (16, True), (64, False), (64, True), (1, True)]  # (page size, random page order)


def main():
    ap = result_parser(__doc__)
    ap.add_argument("--tag", default="", help="suffix of the result files")
    args = ap.parse_args()
    from attngen.runtime import CUDAAttention, RaggedKV
    from attngen.testing import paged_copy
    from attngen.variants import builtin

    att = CUDAAttention.build(builtin("causal"), head_dims=(D,), dtypes=("bfloat16",), kernels=("prefill",))
    rng = np.random.default_rng(0)
    res, rows = run_info(args.commit), []
    keys = ["ragged"] + [f"p{p}_{'random' if s else 'in_order'}" for p, s in POOLS]  # the timed views
    for qo_len, kv_len in CASES:
        flops = 4.0 * D * HQ * sum(kv_len - qo_len + i + 1 for i in range(qo_len))
        q = torch.randn(qo_len, HQ, D, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(kv_len, HKV, D, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(kv_len, HKV, D, dtype=torch.bfloat16, device="cuda")
        qo = torch.tensor([0, qo_len], dtype=torch.int32, device="cuda")
        row = {"case": f"q{qo_len} kv{kv_len}"}

        ragged = RaggedKV(k, v, torch.tensor([0, kv_len], dtype=torch.int32, device="cuda"))
        row["ragged"], ref = time_prefill(att, q, ragged, qo, D, reps=20, template="hopper")
        for key, (page, shuffled) in zip(keys[1:], POOLS):
            paged = paged_copy(k, v, [0, kv_len], page, "NHD", rng if shuffled else None)
            row[key], out = time_prefill(att, q, paged, qo, D, reps=20, template="hopper")
            row[key + "_maxdiff"] = float((out.float() - ref.float()).abs().max())
        row["tflops"] = {key: flops / row[key] / 1e6 for key in keys}
        rows.append(row)
        print(row, flush=True)
    res["rows"] = rows
    lines = [f"# Paged against ragged K/V, Hopper prefill — {res['gpu']}, {res['date']}, commit {res['commit']}", "",
             f"bf16, Hq {HQ} / Hkv {HKV}, D {D}, causal, one request; microseconds per call (TFLOP/s of the visible "
             "work); device time, host ahead, medians.", "",
             "| case | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for r in rows:
        lines.append(f"| {r['case']} | " + " | ".join(f"{r[k]:.1f} ({r['tflops'][k]:.0f})" for k in keys) + " |")
    write_results(args.out, f"paged_gather_{res['date']}{args.tag}", res, lines)


if __name__ == "__main__":
    main()
