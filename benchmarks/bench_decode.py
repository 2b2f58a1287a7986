"""Paged decode benchmark on the GPU: attngen vs FlashInfer (CUDA-core and tensor-core decode) vs SDPA.

Device events, warm-up, medians of back-to-back launches (the host ahead of the GPU); the copy bandwidth of the same
GPU is measured in the same run as the ceiling. Writes JSON and a Markdown table.

    python benchmarks/bench_decode.py --out benchmarks/results
"""
from __future__ import annotations

import datetime
import json
import shutil
import tempfile
import time
from typing import NamedTuple

import torch

from common import bench, case_parser, copy_bandwidth, host_us, selected_cases, write_results

class Case(NamedTuple):
    name: str
    kv_lens: list  # keys per request
    hq: int  # query heads
    hkv: int  # key/value heads
    d: int = 128  # head dim


CASES = [
    Case("gqa B64 L1k", [1024] * 64, 32, 8),
    Case("gqa B64 L4k", [4096] * 64, 32, 8),
    Case("gqa B16 L16k", [16384] * 16, 32, 8),
    Case("gqa B1 L64k", [65536], 32, 8),
    Case("gqa B1 L2k", [2048], 32, 8),
    Case("mha B32 L4k", [4096] * 32, 32, 32),
    Case("skewed 1x32k + 63x512", [32768] + [512] * 63, 32, 8),
    Case("D64 gqa B64 L4k", [4096] * 64, 32, 8, 64),
    Case("D64 gqa B1 L2k", [2048], 32, 8, 64),
    Case("D256 gqa B64 L4k Hq16/Hkv8", [4096] * 64, 16, 8, 256),
    Case("D256 gqa B1 L2k Hq16/Hkv8", [2048], 16, 8, 256),
]
HEAD_DIM, PAGE = 128, 16  # the head dim of the cold-build timing; the page size of every case


def make_case(kv_lens, hq, hkv, head_dim=HEAD_DIM, dtype=torch.bfloat16):
    """Random pages in a random order; request b holds kv_lens[b] keys."""
    batch = len(kv_lens)
    pages_per = [(n + PAGE - 1) // PAGE for n in kv_lens]
    n_pages = sum(pages_per)
    pages = torch.randn(n_pages, 2, PAGE, hkv, head_dim, dtype=dtype, device="cuda")
    indices = torch.randperm(n_pages, device="cuda", dtype=torch.int32)
    indptr = torch.tensor([0] + list(__import__("itertools").accumulate(pages_per)), dtype=torch.int32, device="cuda")
    last = torch.tensor([n - (p - 1) * PAGE for n, p in zip(kv_lens, pages_per)], dtype=torch.int32, device="cuda")
    q = torch.randn(batch, hq, head_dim, dtype=dtype, device="cuda")
    return q, pages, indptr, indices, last


def flashinfer_decode(flashinfer, ws, tensor_cores: bool, indptr, indices, last, hq: int, hkv: int, head_dim: int):
    """FlashInfer's paged decode (CUDA-core or tensor-core path) planned for one bf16 case over NHD pages of PAGE
    slots; ``ws``: its float workspace. Call ``.run(q, pages)``."""
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)
    w.plan(indptr, indices, last, hq, hkv, head_dim, PAGE, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    return w


def main():
    args = case_parser(__doc__, "time attngen alone (no FlashInfer, no SDPA)").parse_args()
    from attngen.runtime import CUDAAttention, PagedKV
    from attngen.runtime.cuda import choose_num_chunks
    from attngen.codegen.cache import BuildCache
    from attngen.variants import builtin

    gpu = torch.cuda.get_device_name()
    results = {"gpu": gpu, "date": datetime.date.today().isoformat(), "commit": args.commit,
               "torch": torch.__version__, "cases": []}
    results["copy_GBps"] = copy_bandwidth()
    t0 = time.perf_counter()
    cold = tempfile.mkdtemp()
    att = CUDAAttention.build(builtin("vanilla"), head_dims=(HEAD_DIM,), dtypes=("bfloat16",), layouts=("NHD",),
                              cache=BuildCache(cold))  # decode + prefill templates, one head dim, one arch
    results["attngen_cold_build_s"] = time.perf_counter() - t0
    shutil.rmtree(cold, ignore_errors=True)
    libs = {HEAD_DIM: att}
    try:
        if not args.peers:
            raise ImportError("not timed (--no-peers)")
        import flashinfer
        results["flashinfer"] = flashinfer.__version__
    except Exception as e:  # noqa: BLE001
        flashinfer = None
        results["flashinfer"] = f"unavailable: {e}"
    fi_jit_s = None
    for name, kv_lens, hq, hkv, d in selected_cases(CASES, args.cases):
        if d not in libs:
            libs[d] = CUDAAttention.build(builtin("vanilla"), head_dims=(d,), dtypes=("bfloat16",), layouts=("NHD",),
                                          kernels=("decode",))
        att = libs[d]
        batch = len(kv_lens)
        q, pages, indptr, indices, last = make_case(kv_lens, hq, hkv, d)
        kv = PagedKV(pages, indptr, indices, last, "NHD")
        nbytes = sum(kv_lens) * hkv * d * 2 * 2 + 2 * q.numel() * 2
        row = {"case": name, "bytes": nbytes, "head_dim": d}
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:2], device="cuda")
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        even = choose_num_chunks(batch, hkv, max(kv_lens), sms)
        for key, tc, chunks, fused in (("attngen_cuda_core", False, None, None), ("attngen_tc_even", True, even, None),
                                       ("attngen_tc_balanced_fused", True, None, True),
                                       ("attngen_tc_balanced_merge_kernel", True, None, False),
                                       ("attngen_tc_balanced", True, None, None),
                                       ("attngen", None, None, None)):  # automatic last
            plan = att.plan_decode(kv, hq, d, tensor_cores=tc, num_chunks=chunks, fused_merge=fused)
            row[f"{key}_chunks"] = plan.num_chunks
            row[f"{key}_grid"] = plan.work is None  # the even-split grid launch (no work list)
            row[f"{key}_ms"] = bench(lambda: att.decode(q, kv, plan=plan, out=out, lse=lse))
        row["attngen_host_us"] = host_us(lambda: att.decode(q, kv, plan=plan, out=out, lse=lse))
        if flashinfer is not None:
            ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
            for tc in (False, True):
                key = "flashinfer_tc_ms" if tc else "flashinfer_cuda_core_ms"
                try:
                    t1 = time.perf_counter()
                    w = flashinfer_decode(flashinfer, ws, tc, indptr, indices, last, hq, hkv, d)
                    w.run(q, pages)
                    torch.cuda.synchronize()
                    if fi_jit_s is None:
                        fi_jit_s = time.perf_counter() - t1
                    row[key] = bench(lambda: w.run(q, pages))
                    row[key.replace("_ms", "_host_us")] = host_us(lambda: w.run(q, pages))
                    ref = w.run(q, pages)
                    row[key.replace("_ms", "_maxdiff")] = float((ref.float() - out.float()).abs().max())
                except Exception as e:  # noqa: BLE001
                    row[key] = None
                    row[key.replace("_ms", "_error")] = str(e)[:300]
        if args.peers:
            try:
                if len(set(kv_lens)) != 1:
                    raise ValueError("dense SDPA needs equal lengths")
                kv_len = kv_lens[0]
                kd = pages[indices.long()][:, 0].reshape(batch, -1, hkv, d)[:, :kv_len].transpose(1, 2).contiguous()
                vd = pages[indices.long()][:, 1].reshape(batch, -1, hkv, d)[:, :kv_len].transpose(1, 2).contiguous()
                qd = q.unsqueeze(2)
                row["sdpa_ms"] = bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                    qd, kd, vd, enable_gqa=hq != hkv), reps=20)
                del kd, vd
            except Exception as e:  # noqa: BLE001
                row["sdpa_ms"] = None
                row["sdpa_error"] = str(e)[:300]
        for k in [k for k in list(row) if k.endswith("_ms") and row[k]]:
            row[k.replace("_ms", "_GBps")] = nbytes / (row[k] * 1e-3) / 1e9
        row["attngen_pct_of_copy"] = 100 * row["attngen_GBps"] / results["copy_GBps"]
        results["cases"].append(row)
        print(json.dumps(row), flush=True)
        del q, pages, kv
        torch.cuda.empty_cache()
        results["flashinfer_first_call_s"] = fi_jit_s
        report(args, results)


def report(args, results: dict) -> None:
    """The JSON and the Markdown table of the cases measured so far (written after every case: a run cut off by
    its time limit keeps what it measured)."""
    fi_jit_s, gpu = results["flashinfer_first_call_s"], results["gpu"]
    stem = f"decode_{results['date']}{args.tag}"
    lines = [f"# Paged decode, bf16, page {PAGE}, D 128 unless named — {gpu}, {results['date']}, commit {args.commit}",
             "",
             f"Copy bandwidth measured in the same run: {results['copy_GBps']:.0f} GB/s. "
             f"attngen cold build (vanilla, decode + prefill, 1 head dim, 1 arch): {results['attngen_cold_build_s']:.1f} s; "
             f"FlashInfer first plan+run (JIT or cached): {fi_jit_s if fi_jit_s is None else round(fi_jit_s, 1)} s.", "",
             "attngen columns: automatic choice (% of copy); CUDA-core template, even split; tensor-core template, "
             "even split; tensor-core template, load-balanced plan. The automatic choice is the load-balanced plan "
             "except for uniform batches it serves no better (decode_plan.grid_chunks_for_uniform_batch). Times: device time per call with the host "
             "ahead of the GPU (benchmarks/common.py bench); the Python call's host time is `*_host_us` in the JSON. "
             "The balanced plan's split requests merged by the decode kernel itself (fused) and by the merge kernel: "
             "`attngen_tc_balanced_fused_GBps` / `attngen_tc_balanced_merge_kernel_GBps` in the JSON, and the "
             "microseconds of every column (`*_ms`).",
             "",
             "| case | attngen GB/s (% copy) | attngen CUDA-core | attngen TC even | attngen TC balanced "
             "| FI cuda-core GB/s | FI tensor-core GB/s | SDPA GB/s | attngen / best FI |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results["cases"]:
        fi = [r.get("flashinfer_cuda_core_GBps"), r.get("flashinfer_tc_GBps")]
        best = max([x for x in fi if x] or [float("nan")])
        lines.append(f"| {r['case']} | {r['attngen_GBps']:.0f} ({r['attngen_pct_of_copy']:.0f}%) | "
                     f"{r['attngen_cuda_core_GBps']:.0f} | {r['attngen_tc_even_GBps']:.0f} | "
                     f"{r['attngen_tc_balanced_GBps']:.0f} | "
                     f"{fi[0] or float('nan'):.0f} | {fi[1] or float('nan'):.0f} | {r.get('sdpa_GBps') or float('nan'):.0f} | "
                     f"{r['attngen_GBps'] / best:.2f} |")
    write_results(args.out, stem, results, lines)


if __name__ == "__main__":
    main()
