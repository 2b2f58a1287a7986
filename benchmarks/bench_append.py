"""Append over a long paged cache: few query rows per request against many keys, as speculative decoding's
verify step (4-16 draft tokens) and chunked prefill (a chunk of a long prompt after its earlier chunks) run it.
attngen's prefill templates (Hopper on sm_90a, the mma.sync one) against FlashInfer's batch prefill over the same
paged cache (fa2, fa3), in the same run with the same timer.

bf16, Hq 32 / Hkv 8, D 128, pages of 16 tokens in random order, causal (query row i of a request of qo_len rows
and kv_len keys at position kv_len - qo_len + i). Microseconds per call and TFLOP/s of the visible work
(4 * D * Hq * visible query-key pairs).

    python benchmarks/bench_append.py --out benchmarks/results --commit <sha> [--no-peers] [--cases a,b]
    python benchmarks/bench_append.py --jit fa2   # compiles FlashInfer's paged prefill module of a backend only
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch

from common import (bench, case_parser, cell, error_lines, guarded, load_flashinfer, run_info, selected_cases,
                    time_prefill, write_results)

HQ, HKV, D, PAGE = 32, 8, 128, 16


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    qo_len: int  # query rows per request
    kv_len: int  # keys per request, the query rows' own among them

    def visible_pairs(self) -> int:
        # row i sees kv_len - qo_len + i + 1 keys
        return self.batch * sum(self.kv_len - self.qo_len + i + 1 for i in range(self.qo_len))

    def flops(self) -> float:
        return 4.0 * D * HQ * self.visible_pairs()


CASES = [
    Case("verify B1 q8 kv8k", 1, 8, 8192),
    Case("verify B4 q8 kv8k", 4, 8, 8192),
    Case("verify B32 q8 kv4k", 32, 8, 4096),
    Case("verify B8 q16 kv16k", 8, 16, 16384),
    Case("chunk B1 q512 kv32k", 1, 512, 32768),
    Case("chunk B4 q256 kv16k", 4, 256, 16384),
    Case("chunk B1 q2k kv16k", 1, 2048, 16384),
]
PEERS = ("flashinfer_fa2", "flashinfer_fa3")


def make_inputs(case: Case, rng):
    """q [B * qo_len, Hq, D], a paged cache [P, 2, PAGE, Hkv, D] in random page order, and its page table."""
    pages_per = -(-case.kv_len // PAGE)
    n_pages = case.batch * pages_per
    q = torch.randn(case.batch * case.qo_len, HQ, D, dtype=torch.bfloat16, device="cuda")
    cache = torch.randn(n_pages, 2, PAGE, HKV, D, dtype=torch.bfloat16, device="cuda")
    order = torch.as_tensor(rng.permutation(n_pages).astype(np.int32), device="cuda")
    page_indptr = torch.arange(0, n_pages + 1, pages_per, dtype=torch.int32, device="cuda")
    last = torch.full((case.batch,), case.kv_len - (pages_per - 1) * PAGE, dtype=torch.int32, device="cuda")
    qo_indptr = torch.arange(0, case.batch * case.qo_len + 1, case.qo_len, dtype=torch.int32, device="cuda")
    return q, cache, page_indptr, order, last, qo_indptr


def time_attngen(att, q, cache, page_indptr, order, last, qo_indptr, template: str, tail_split=None):
    from attngen.runtime import PagedKV

    kv = PagedKV(cache, page_indptr, order, last, "NHD")
    return time_prefill(att, q, kv, qo_indptr, D, template=template, tail_split=tail_split)


def flashinfer_call(fi, q, cache, page_indptr, order, last, qo_indptr, backend: str):
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
    w.plan(qo_indptr, page_indptr, order, last, HQ, HKV, D, PAGE, causal=True, q_data_type=q.dtype)
    return lambda: w.run(q, cache)


def time_flashinfer(fi, inputs, backend: str, ref):
    fn = flashinfer_call(fi, *inputs, backend)
    us = bench(fn, reps=30) * 1e3
    return us, float((fn().float() - ref.float()).abs().max())


def jit_only(backend: str) -> None:
    """Builds FlashInfer's paged prefill module of ``backend`` for these shapes (one call on a small case)."""
    fi = load_flashinfer()[0]
    row: dict = {}
    guarded(row, backend, lambda: flashinfer_call(fi, *make_inputs(Case("jit", 2, 4, 64), np.random.default_rng(0)),
                                                  backend)())
    print("jit", backend, row or "done", flush=True)


def main():
    if sys.argv[1:2] == ["--jit"]:
        jit_only(sys.argv[2])
        return
    args = case_parser(__doc__, "time attngen's templates only").parse_args()
    cases = selected_cases(CASES, args.cases)
    from attngen.runtime import CUDAAttention
    from attngen.variants import builtin

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    res = run_info(args.commit)
    fi = load_flashinfer()[0] if args.peers else None
    templates = (("hopper",) if torch.cuda.get_device_capability()[0] == 9 else ()) + ("mma_sync",)
    att = CUDAAttention.build(builtin("causal"), head_dims=(D,), dtypes=("bfloat16",), kernels=("prefill",))
    rows = []
    for case in cases:
        inputs = make_inputs(case, rng)
        row, flops, ref = {"case": case.name}, case.flops(), None
        for template in templates:
            us, out = time_attngen(att, *inputs, template)
            row[f"attngen_{template}"], row[f"attngen_{template}_us"] = flops / us / 1e6, us
            if ref is None:
                ref = out
            else:
                row["templates_maxdiff"] = float((out.float() - ref.float()).abs().max())
        if "hopper" in templates:  # the Hopper template without its split of the key tiles (runtime/work_tail.py)
            us, out = time_attngen(att, *inputs, "hopper", tail_split=False)
            row["attngen_hopper_unsplit"], row["attngen_hopper_unsplit_us"] = flops / us / 1e6, us
            row["unsplit_maxdiff"] = float((out.float() - ref.float()).abs().max())
        if fi is not None:
            for backend in ("fa2", "fa3"):
                got = guarded(row, f"flashinfer_{backend}", lambda: time_flashinfer(fi, inputs, backend, ref))
                if got:
                    row[f"flashinfer_{backend}"], row[f"flashinfer_{backend}_us"] = flops / got[0] / 1e6, got[0]
                    row[f"flashinfer_{backend}_maxdiff"] = got[1]
        rows.append(row)
        print(row, flush=True)
        report(args, res, rows)
        inputs = ref = None
        torch.cuda.empty_cache()


def report(args, res: dict, rows: list[dict]) -> None:
    """The JSON and the Markdown table of the rows measured so far."""
    res["rows"] = rows
    stem = f"append_{res['date']}{args.tag}"
    lines = [f"# Append over a long paged cache — {res['gpu']}, {res['date']}, commit {res['commit']}", "",
             f"bf16, Hq {HQ} / Hkv {HKV}, D {D}, causal, pages of {PAGE} in random order; microseconds per call "
             f"(TFLOP/s of the visible work); device time, host ahead, medians. torch {res['torch']}, FlashInfer "
             f"{res['flashinfer']}.", "",
             "| case | attngen Hopper | Hopper without the split | attngen mma.sync | FlashInfer fa2 | FlashInfer fa3 | "
             "attngen best / peer best |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        def both(k):
            return f"{cell(r.get(k + '_us'), '.1f')} ({cell(r.get(k))})" if r.get(k) else "—"
        ours = [r[k] for k in ("attngen_hopper", "attngen_mma_sync") if r.get(k)]
        peers = [r[k] for k in PEERS if r.get(k)]
        ratio = f"{max(ours) / max(peers):.2f}" if ours and peers else "—"
        lines.append(f"| {r['case']} | {both('attngen_hopper')} | {both('attngen_hopper_unsplit')} | "
                     f"{both('attngen_mma_sync')} | "
                     f"{both('flashinfer_fa2')} | {both('flashinfer_fa3')} | {ratio} |")
    lines += error_lines(rows, lambda r: r["case"])
    write_results(args.out, stem, res, lines)


if __name__ == "__main__":
    main()
