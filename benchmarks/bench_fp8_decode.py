"""Decode over an fp8 KV cache: attngen reading float8_e4m3fn pages (the tensor-core decode template with its
load-balanced plan, csrc/decode_tc.cuh) against attngen over the same values in bfloat16 and FlashInfer's decode
over the same fp8 pages (its CUDA-core and tensor-core paths, the faster reported), in the same run with the same
timer (CUDA events, warm-up, medians: common.bench), beside the GPU's copy bandwidth measured in the same run.

Cases (bf16 queries, D 128 unless named, paged NHD cache of 16-token pages in a random permutation): the
memory-bound shapes of bench_decode.py, and one of them over an HND cache (a KV head's 16 rows of a page
contiguous, 2 KB of e4m3 at D 128, where NHD gives 128-byte runs: whether the fp8 decode is held by DRAM
serving short runs shows as the two layouts' gap). One scale per cache (k_scale, v_scale floats: the power of
two that maps the largest magnitude into e4m3's range; ``--scale-tensors``: attngen gets them as one-entry float32
CUDA tensors); the bf16 cache holds the dequantised values exactly.
Bandwidth counts the bytes each implementation reads (K/V in its cache's element size, plus q and the output);
"fp8 / bf16" is the ratio of the two caches' attngen throughputs (time of bf16 over time of fp8: the target is
1.9 or more).
Writes ``fp8_decode_<date>.{json,md}``.

    python benchmarks/bench_fp8_decode.py --out benchmarks/results --commit <sha> [--no-peers]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from common import (bench, case_parser, cell, copy_bandwidth, error_lines, guarded, load_flashinfer, run_cases,
                    run_info, selected_cases, write_results)

PAGE = 16
FP8 = "float8_e4m3fn"


@dataclass(frozen=True)
class Case:
    name: str
    kv_lens: tuple[int, ...]
    hq: int = 32
    hkv: int = 8
    d: int = 128
    layout: str = "NHD"  # the page layout: NHD [P, 2, PAGE, Hkv, D] or HND [P, 2, Hkv, PAGE, D]

    def kv_elements(self) -> int:
        return 2 * sum(self.kv_lens) * self.hkv * self.d

    def bytes_read(self, kv_bytes: int) -> int:
        return self.kv_elements() * kv_bytes + 2 * len(self.kv_lens) * self.hq * self.d * 2


CASES = [
    Case("gqa B64 L4k", (4096,) * 64),
    Case("gqa B64 L4k HND", (4096,) * 64, layout="HND"),
    Case("gqa B16 L16k", (16384,) * 16),
    Case("gqa B1 L64k", (65536,)),
    Case("gqa B64 L4k D64", (4096,) * 64, d=64),
    Case("mha B32 L4k", (4096,) * 32, hq=32, hkv=32),
    Case("gqa B32 L8k D256", (8192,) * 32, hq=16, hkv=8, d=256),
    Case("skewed 1x32k + 63x512", (32768,) + (512,) * 63),
]
IMPLS = ("attngen_fp8", "attngen_bf16", "flashinfer_fp8")


def make_inputs(case: Case, gen: torch.Generator):
    """q [B, Hq, D] bf16, the bf16 pages [P, 2, PAGE, Hkv, D] (HND: [P, 2, Hkv, PAGE, D]) in a random page order,
    their fp8 copy, the scales and the page table (device tensors)."""
    n_pages = [-(-k // PAGE) for k in case.kv_lens]
    total = sum(n_pages)
    q = torch.randn(len(case.kv_lens), case.hq, case.d, dtype=torch.bfloat16, device="cuda", generator=gen)
    rows = (PAGE, case.hkv) if case.layout == "NHD" else (case.hkv, PAGE)
    pages = torch.randn(total, 2, *rows, case.d, dtype=torch.bfloat16, device="cuda", generator=gen)
    k_scale, v_scale = (2.0 ** float(np.ceil(np.log2(float(pages[:, i].abs().max()) / 448.0))) for i in (0, 1))
    scale = torch.tensor([k_scale, v_scale], device="cuda").view(1, 2, 1, 1, 1)
    fp8 = (pages.float() / scale).clamp(-448.0, 448.0).to(getattr(torch, FP8))
    pages = (fp8.float() * scale).to(torch.bfloat16)  # exact: an fp8 value times a power of two
    i32 = dict(dtype=torch.int32, device="cuda")
    table = dict(indptr=torch.tensor(np.concatenate([[0], np.cumsum(n_pages)]), **i32),
                 indices=torch.randperm(total, device="cuda", generator=gen).to(torch.int32),
                 last_page_len=torch.tensor([k - (p - 1) * PAGE for k, p in zip(case.kv_lens, n_pages)], **i32))
    return q, pages, fp8, k_scale, v_scale, table


def time_attngen(att, case: Case, q, pages, table, scales=None, tensor_cores=None, kv_heads_per_cta=None):
    """(ms, out, KV heads per CTA) of attngen's decode over ``pages`` (fp8 with ``scales``, or bf16), the automatic
    plan (or the template ``tensor_cores`` forces; ``kv_heads_per_cta``: None automatic, 1 one head, 2 a pair
    where plan_decode takes one, else one head)."""
    from attngen.runtime import AttentionArgumentError, PagedKV

    kv = PagedKV(pages, table["indptr"], table["indices"], table["last_page_len"], case.layout)
    try:
        plan = att.plan_decode(kv, case.hq, case.d, tensor_cores=tensor_cores,
                               **({} if kv_heads_per_cta is None else {"kv_heads_per_cta": kv_heads_per_cta}))
    except AttentionArgumentError:
        if kv_heads_per_cta != 2:
            raise
        plan = att.plan_decode(kv, case.hq, case.d, tensor_cores=tensor_cores, kv_heads_per_cta=1)
    out = torch.full_like(q, float("nan"))
    lse = torch.empty(q.shape[:2], device="cuda")
    fn = lambda: att.decode(q, kv, plan=plan, out=out, lse=lse, **(scales or {}))  # noqa: E731
    return bench(fn), out, plan.kv_heads_per_cta


def time_flashinfer_fp8(fi, case: Case, q, fp8, k_scale, v_scale, table, ref, row):
    """FlashInfer's decode over the fp8 pages: its CUDA-core and tensor-core paths; the faster one's ms."""
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    best = None
    for tc in (False, True):
        def one():
            w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, case.layout, use_tensor_cores=tc)
            w.plan(table["indptr"], table["indices"], table["last_page_len"], case.hq, case.hkv, case.d, PAGE,
                   q_data_type=q.dtype, kv_data_type=fp8.dtype)
            fn = lambda: w.run(q, fp8, k_scale=k_scale, v_scale=v_scale)  # noqa: E731
            return bench(fn), float((fn().float() - ref.float()).abs().max())
        got = guarded(row, f"flashinfer_fp8_{'tc' if tc else 'cuda_core'}", one)
        if got:
            row[f"flashinfer_fp8_{'tc' if tc else 'cuda_core'}_ms"] = got[0]
            best = got if best is None or got[0] < best[0] else best
    return best


def run_case(case: Case, libs: dict, fi, gen: torch.Generator, pairs=None, scale_tensors=False) -> dict:
    q, pages, fp8, k_scale, v_scale, table = make_inputs(case, gen)
    att, row = libs[case.d], {"case": case.name}
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    if scale_tensors:  # (one-entry float32 tensors on the GPU, as serving runtimes keep a layer's scales)
        scales = {k: torch.tensor([s], dtype=torch.float32, device="cuda") for k, s in scales.items()}
    ms, ref, row["attngen_fp8_kv_heads_per_cta"] = time_attngen(att, case, q, fp8, table, scales=scales,
                                                                 kv_heads_per_cta=pairs)
    row["attngen_fp8_ms"], row["attngen_fp8"] = ms, case.bytes_read(1) / ms / 1e6
    got = guarded(row, "attngen_fp8_cuda_cores",
                  lambda: time_attngen(att, case, q, fp8, table, scales=scales, tensor_cores=False))
    if got:  # the CUDA-core template over the same fp8 pages (the automatic plan takes tensor cores)
        row["attngen_fp8_cc_ms"], row["attngen_fp8_cc"] = got[0], case.bytes_read(1) / got[0] / 1e6
        row["attngen_fp8_cc_maxdiff"] = float((got[1].float() - ref.float()).abs().max())
    got = guarded(row, "attngen_bf16", lambda: time_attngen(att, case, q, pages, table, kv_heads_per_cta=pairs))
    if got:
        row["attngen_bf16_ms"], row["attngen_bf16"] = got[0], case.bytes_read(2) / got[0] / 1e6
        row["attngen_bf16_kv_heads_per_cta"] = got[2]
        row["attngen_bf16_maxdiff"] = float((got[1].float() - ref.float()).abs().max())
    if fi is not None:
        got = time_flashinfer_fp8(fi, case, q, fp8, k_scale, v_scale, table, ref, row)
        if got:
            row["flashinfer_fp8_ms"], row["flashinfer_fp8"] = got[0], case.bytes_read(1) / got[0] / 1e6
            row["flashinfer_fp8_maxdiff"] = got[1]
    return row


def markdown(res: dict, rows: list[dict], commit: str) -> list[str]:
    copy = res["copy_GBps"]
    lines = [f"# Decode over an fp8 (e4m3) KV cache — {res['gpu']}, {res['date']}, commit {commit}", "",
             f"GB/s of the bytes each implementation reads (device time, host ahead; medians). Copy bandwidth in the "
             f"same run: {copy:.0f} GB/s. torch {res['torch']}, FlashInfer {res['flashinfer']}. bf16 queries, paged "
             "cache (16-token pages, random order; NHD unless the case names HND). attngen fp8: the tensor-core "
             "decode over e4m3 pages; attngen bf16: the same library over the same values in bf16; FlashInfer fp8: "
             "its decode over the same e4m3 pages (the faster of its CUDA-core and tensor-core paths). fp8 / bf16: "
             "attngen's bf16 time over its fp8 time. attngen fp8, CUDA cores: the same library's CUDA-core template "
             "(tensor_cores=False) over the fp8 pages.", "",
             "| case | attngen fp8 GB/s (% copy) | attngen fp8, CUDA cores GB/s | attngen bf16 GB/s | "
             "FlashInfer fp8 GB/s | fp8 / bf16 (time) | attngen fp8 / FlashInfer fp8 (time) | max diff bf16 | "
             "max diff CUDA cores | max diff FlashInfer |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speed = (f"{r['attngen_bf16_ms'] / r['attngen_fp8_ms']:.2f}" if r.get("attngen_bf16_ms") else "—")
        vs_fi = (f"{r['flashinfer_fp8_ms'] / r['attngen_fp8_ms']:.2f}" if r.get("flashinfer_fp8_ms") else "—")
        lines.append(f"| {r['case']} | {r['attngen_fp8']:.0f} ({100 * r['attngen_fp8'] / copy:.0f}%) | "
                     f"{cell(r.get('attngen_fp8_cc'))} | {cell(r.get('attngen_bf16'))} | "
                     f"{cell(r.get('flashinfer_fp8'))} | {speed} | {vs_fi} | "
                     f"{cell(r.get('attngen_bf16_maxdiff'), '.3g')} | {cell(r.get('attngen_fp8_cc_maxdiff'), '.3g')} | "
                     f"{cell(r.get('flashinfer_fp8_maxdiff'), '.3g')} |")
    return lines + error_lines(rows, lambda r: r["case"])


def main():
    ap = case_parser(__doc__, "time attngen only")
    ap.add_argument("--kv-heads-per-cta", type=int, choices=(1, 2), default=None,
                    help="plan_decode's kv_heads_per_cta for attngen's tensor-core plans (default: automatic)")
    ap.add_argument("--scale-tensors", action="store_true",
                    help="pass attngen the scales as one-entry float32 CUDA tensors instead of floats")
    args = ap.parse_args()
    cases = selected_cases(CASES, args.cases)
    gen = torch.Generator(device="cuda").manual_seed(0)
    res = run_info(args.commit) | {"copy_GBps": copy_bandwidth()}
    fi = load_flashinfer()[0] if args.peers else None
    from attngen.runtime import CUDAAttention
    from attngen.variants import builtin

    dims = tuple(sorted({c.d for c in cases}))
    att = CUDAAttention.build(builtin("vanilla"), head_dims=dims, dtypes=("bfloat16", "bfloat16"),
                              kv_dtypes=("bfloat16", FP8), layouts=tuple(sorted({c.layout for c in cases})),
                              kernels=("decode",))
    libs = {d: att for d in dims}
    rows = run_cases(cases, lambda case: run_case(case, libs, fi, gen, args.kv_heads_per_cta,
                                                         args.scale_tensors))
    res["rows"] = rows
    write_results(args.out, f"fp8_decode_{res['date']}{args.tag}", res, markdown(res, rows, args.commit))


if __name__ == "__main__":
    main()
