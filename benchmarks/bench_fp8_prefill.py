"""Prefill / append over an fp8 KV cache: attngen reading float8_e4m3fn pages on each template (Hopper:
csrc/hopper_fp8_stage.cuh, on sm_90a; mma.sync: csrc/kv_staging.cuh) against attngen over the same cache in
bfloat16 on the same two templates (which isolates what fp8 costs or saves in each) and FlashInfer's prefill over
fp8 pages (fa2 backend, when flashinfer imports), in the same run with the same timer (CUDA events, warm-up,
medians: common.bench).

Cases (bf16 queries, Hq 32 / Hkv 8, D 128 unless named, paged NHD cache of 16-token pages in a random
permutation, causal): one prompt of 4k and of 16k tokens, a 512-token chunk appended to 8k of context, D 64 at
8k (Hq = Hkv = 16), and a ragged batch of 64 prompts of 64..1024 tokens. One scale per cache (k_scale, v_scale
floats: the power of two that maps the largest magnitude into e4m3's range), which every implementation takes;
the bf16 cache holds the dequantised values exactly (fp8 times a power of two), so every implementation sees the
same keys and values. TFLOP/s of the visible work: 4 * D * Hq * (visible query-key pairs), and the largest
difference of each output from attngen's fp8 output on the mma.sync template. Writes ``fp8_prefill_<date>.{json,md}``.

    python benchmarks/bench_fp8_prefill.py --out benchmarks/results --commit <sha> [--no-peers]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from common import (bench, case_parser, cell, error_lines, guarded, load_flashinfer, run_cases, run_info,
                    selected_cases, write_results)

PAGE = 16
FP8 = "float8_e4m3fn"


@dataclass(frozen=True)
class Case:
    name: str
    qo_lens: tuple[int, ...]  # one entry per request
    kv_lens: tuple[int, ...]  # keys per request (>= its queries: query i sits at kv_len - qo_len + i)
    hq: int = 32
    hkv: int = 8
    d: int = 128

    def visible_pairs(self) -> int:  # causal: query i of a request sees kv_len - qo_len + i + 1 keys
        return sum(q * (k - q) + q * (q + 1) // 2 for q, k in zip(self.qo_lens, self.kv_lens))

    def flops(self) -> float:
        return 4.0 * self.d * self.hq * self.visible_pairs()


def _short_prompts() -> tuple[int, ...]:
    rng = np.random.default_rng(0)
    return tuple(int(x) for x in rng.integers(64, 1025, size=64))


CASES = [
    Case("causal L4k", (4096,), (4096,)),
    Case("causal L16k", (16384,), (16384,)),
    Case("append 512 after 8k", (512,), (8704,)),
    Case("causal L8k D64 Hq=Hkv=16", (8192,), (8192,), hq=16, hkv=16, d=64),
    Case("ragged 64 prompts 64-1024", _short_prompts(), _short_prompts()),
]
IMPLS = ("attngen_fp8_hopper", "attngen_fp8_mma_sync", "attngen_bf16", "attngen_bf16_mma_sync", "flashinfer_fp8")


def make_inputs(case: Case, gen: torch.Generator):
    """q [n, Hq, D] bf16, the bf16 pages [P, 2, PAGE, Hkv, D] in a random page order, their fp8 copy, the scales
    and the page table (device tensors)."""
    n_pages = [-(-k // PAGE) for k in case.kv_lens]
    total = sum(n_pages)
    q = torch.randn(sum(case.qo_lens), case.hq, case.d, dtype=torch.bfloat16, device="cuda", generator=gen)
    pages = torch.randn(total, 2, PAGE, case.hkv, case.d, dtype=torch.bfloat16, device="cuda", generator=gen)
    # powers of two that map the largest magnitude below 448 (e4m3's largest finite value)
    k_scale, v_scale = (2.0 ** float(np.ceil(np.log2(float(pages[:, i].abs().max()) / 448.0))) for i in (0, 1))
    scale = torch.tensor([k_scale, v_scale], device="cuda").view(1, 2, 1, 1, 1)
    fp8 = (pages.float() / scale).clamp(-448.0, 448.0).to(getattr(torch, FP8))  # round to nearest, saturate
    pages = (fp8.float() * scale).to(torch.bfloat16)  # exact: an fp8 value times a power of two
    perm = torch.randperm(total, device="cuda", generator=gen).to(torch.int32)
    i32 = dict(dtype=torch.int32, device="cuda")
    table = dict(qo_indptr=torch.tensor(np.concatenate([[0], np.cumsum(case.qo_lens)]), **i32),
                 indptr=torch.tensor(np.concatenate([[0], np.cumsum(n_pages)]), **i32), indices=perm,
                 last_page_len=torch.tensor([k - (p - 1) * PAGE for k, p in zip(case.kv_lens, n_pages)], **i32))
    return q, pages, fp8, k_scale, v_scale, table


def time_attngen(att, case: Case, q, pages, table, template=None, scales=None):
    """(ms, out) of attngen's paged prefill over ``pages`` (fp8 with ``scales``, or bf16)."""
    from attngen.runtime import PagedKV

    kv = PagedKV(pages, table["indptr"], table["indices"], table["last_page_len"])
    plan = att.plan_prefill(table["qo_indptr"], kv, case.d, template=template)
    out = torch.full_like(q, float("nan"))
    lse = torch.empty(q.shape[:2], device="cuda")
    fn = lambda: att.prefill(q, kv, table["qo_indptr"], plan=plan, out=out, lse=lse, **(scales or {}))  # noqa: E731
    return bench(fn, reps=20), out


def time_flashinfer_fp8(fi, case: Case, q, fp8, k_scale, v_scale, table, ref):
    """FlashInfer's paged prefill over the fp8 pages (fa2 backend), its k_scale / v_scale floats."""
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    w.plan(table["qo_indptr"], table["indptr"], table["indices"], table["last_page_len"], case.hq, case.hkv, case.d,
           PAGE, causal=True, q_data_type=q.dtype, kv_data_type=fp8.dtype)
    fn = lambda: w.run(q, fp8, k_scale=k_scale, v_scale=v_scale)  # noqa: E731
    ms = bench(fn, reps=20)
    return ms, float((fn().float() - ref.float()).abs().max())


def build_libraries(cases: list[Case]) -> dict:
    """head_dim -> attngen's causal prefill library with bf16 queries over bf16 and over fp8 pages."""
    from attngen.runtime import CUDAAttention
    from attngen.variants import builtin

    dims = tuple(sorted({c.d for c in cases}))
    att = CUDAAttention.build(builtin("causal"), head_dims=dims, dtypes=("bfloat16", "bfloat16"),
                              kv_dtypes=("bfloat16", FP8), layouts=("NHD",), kernels=("prefill",))
    return {d: att for d in dims}


def run_case(case: Case, libs: dict, fi, gen: torch.Generator) -> dict:
    q, pages, fp8, k_scale, v_scale, table = make_inputs(case, gen)
    att, flops, row = libs[case.d], case.flops(), {"case": case.name}
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    ms, ref = time_attngen(att, case, q, fp8, table, template="mma_sync", scales=scales)
    row["attngen_fp8_mma_sync"], row["attngen_fp8_mma_sync_ms"] = flops / ms / 1e9, ms
    for key, cache, template, sc in (("attngen_fp8_hopper", fp8, "hopper", scales),  # refused off sm_90a
                                     ("attngen_bf16", pages, None, None),  # None: Hopper on sm_90
                                     ("attngen_bf16_mma_sync", pages, "mma_sync", None)):
        got = guarded(row, key, lambda: time_attngen(att, case, q, cache, table, template=template, scales=sc))
        if got:
            row[key], row[f"{key}_ms"] = flops / got[0] / 1e9, got[0]
            row[f"{key}_maxdiff"] = float((got[1].float() - ref.float()).abs().max())
    if fi is not None:
        got = guarded(row, "flashinfer_fp8", lambda: time_flashinfer_fp8(fi, case, q, fp8, k_scale, v_scale, table,
                                                                          ref))
        if got:
            row["flashinfer_fp8"], row["flashinfer_fp8_ms"], row["flashinfer_fp8_maxdiff"] = flops / got[0] / 1e9, \
                got[0], got[1]
    return row


def markdown(res: dict, rows: list[dict], commit: str) -> list[str]:
    lines = [f"# Prefill over an fp8 (e4m3) KV cache — {res['gpu']}, {res['date']}, commit {commit}", "",
             f"TFLOP/s of the visible work (device time, host ahead; medians of 20). torch {res['torch']}, "
             f"FlashInfer {res['flashinfer']}. bf16 queries, paged NHD cache (16-token pages, random order), causal; "
             "attngen fp8: each template over e4m3 pages (Hopper on sm_90a); attngen bf16: the library's template "
             "over the same values in bf16 (Hopper on sm_90a), and the mma.sync one; FlashInfer fp8: its paged prefill "
             "(fa2) over the same e4m3 pages. The bf16 cache holds the same values; max diff: the largest |difference| "
             "from attngen fp8's output on the mma.sync template.", "",
             "| case | attngen fp8 Hopper | attngen fp8 mma.sync | attngen bf16 | attngen bf16 mma.sync | "
             "FlashInfer fp8 | fp8 / bf16 Hopper | fp8 / bf16 mma.sync | max diff fp8 Hopper | "
             "max diff bf16 mma.sync | max diff FlashInfer |", "|---|---|---|---|---|---|---|---|---|---|---|"]

    def ratio(r, fp8, bf16):
        return f"{r[fp8] / r[bf16]:.2f}" if r.get(fp8) and r.get(bf16) else "—"

    for r in rows:
        lines.append(f"| {r['case']} | " + " | ".join(cell(r.get(k)) for k in IMPLS) + " | "
                     f"{ratio(r, 'attngen_fp8_hopper', 'attngen_bf16')} | "
                     f"{ratio(r, 'attngen_fp8_mma_sync', 'attngen_bf16_mma_sync')} | "
                     + " | ".join(cell(r.get(f"{k}_maxdiff"), ".3g")
                                  for k in ("attngen_fp8_hopper", "attngen_bf16_mma_sync", "flashinfer_fp8")) + " |")
    return lines + error_lines(rows, lambda r: r["case"])


def main():
    args = case_parser(__doc__, "time attngen only").parse_args()
    cases = selected_cases(CASES, args.cases)
    gen = torch.Generator(device="cuda").manual_seed(0)
    res = run_info(args.commit)
    fi = load_flashinfer()[0] if args.peers else None
    libs = build_libraries(cases)
    rows = run_cases(cases, lambda case: run_case(case, libs, fi, gen))
    res["rows"] = rows
    write_results(args.out, f"fp8_prefill_{res['date']}{args.tag}", res, markdown(res, rows, args.commit))


if __name__ == "__main__":
    main()
