"""Where decode time goes, per plan: for fp8 (e4m3) and bf16 caches over the same values, the call's device time
(common.bench: CUDA events, host ahead, medians) and the profiler's mean duration of each kernel it launches (the
decode kernel, the split-KV merge kernel), for the automatic plan, the fused merge forced on and off, and even
splits of 8 / 16 / 33 / 66 chunks a request. Cases: bench_fp8_decode.py's weak ones (B 1 L 64k, D 64, a skewed
batch) and batch-1 decode at D 64 / 128 / 256 (2k keys).

Kernel durations overlap where the merge kernel is a programmatic dependent launch (it starts before the decode
grid ends and waits): the call time is the number to compare; a kernel's duration says which one holds it.

    cd benchmarks && python decode_breakdown.py --out results --commit $(git rev-parse --short HEAD)
"""
from __future__ import annotations

import torch
from bench_fp8_decode import CASES, Case, make_inputs
from common import bench, result_parser, run_info, write_results

EXTRA = [Case("D64 gqa B1 L2k", (2048,), d=64), Case("D256 gqa B1 L2k", (2048,), hq=16, hkv=8, d=256),
         Case("gqa B1 L2k", (2048,))]
DEFAULT_CASES = "gqa B1 L64k,gqa B64 L4k D64,skewed 1x32k + 63x512,D64 gqa B1 L2k,D256 gqa B1 L2k,gqa B1 L2k"
PLANS = [("auto", {}), ("fused", dict(fused_merge=True)), ("merge_kernel", dict(fused_merge=False))]
PLANS += [(f"even{c}", dict(num_chunks=c, tensor_cores=True)) for c in (8, 16, 33, 66)]


def kernel_times(fn, reps: int = 20) -> dict:
    """{kernel name (60 characters): mean device microseconds per call} over ``reps`` profiled calls."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if total and e.count >= reps and "Memcpy" not in e.key:
            out[e.key[:60]] = round(total / e.count, 2)
    return out


def short_name(kernel: str) -> str:
    """``decode_tc_kernel`` from ``void attngen::decode_tc_kernel<...``."""
    return kernel.split("<")[0].split("::")[-1]


def measure(att, case: Case, gen) -> list[dict]:
    from attngen.runtime import PagedKV

    q, pages, fp8, ks, vs, table = make_inputs(case, gen)
    rows = []
    for kvname, cache, scales in (("fp8", fp8, dict(k_scale=ks, v_scale=vs)), ("bf16", pages, {})):
        kv = PagedKV(cache, table["indptr"], table["indices"], table["last_page_len"], case.layout)
        for pname, kw in PLANS:
            row = dict(case=case.name, kv=kvname, plan=pname)
            try:
                plan = att.plan_decode(kv, case.hq, case.d, **kw)
            except Exception as e:  # noqa: BLE001  (a plan the shape refuses is recorded)
                rows.append({**row, "refused": str(e)[:200]})
                continue
            out = torch.empty_like(q)
            fn = lambda: att.decode(q, kv, plan=plan, out=out, **scales)  # noqa: E731
            ms = bench(fn)
            gbps = case.bytes_read(1 if kvname == "fp8" else 2) / ms / 1e6
            rows.append({**row, "us": round(ms * 1e3, 2), "GBps": round(gbps), "kernels": kernel_times(fn)})
            print(rows[-1], flush=True)
    return rows


def markdown(info: dict, rows: list[dict]) -> list[str]:
    lines = [f"# Decode time by plan — {info['gpu']}, {info['date']}, commit {info['commit']}", "",
             "bf16 queries, paged NHD cache (16-token pages, random order), Hq 32 / Hkv 8 and D 128 unless named; "
             "fp8: e4m3 pages with per-tensor scales. Call: device time per call (host ahead, medians); GB/s of the "
             "bytes read; kernels: the profiler's mean duration of each kernel (they overlap where the merge is a "
             "programmatic dependent launch).", "",
             "| case | KV | plan | call us | GB/s | decode kernel us | merge kernel us |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['case']} | {r['kv']} | {r['plan']} | refused | | | |")
            continue
        k = {short_name(n): t for n, t in r["kernels"].items()}
        lines.append(f"| {r['case']} | {r['kv']} | {r['plan']} | {r['us']:.2f} | {r['GBps']} | "
                     f"{k.get('decode_tc_kernel', '—')} | {k.get('merge_decode_kernel', '—')} |")
    return lines


def main():
    from attngen.runtime import CUDAAttention
    from attngen.variants import builtin

    ap = result_parser(__doc__)
    ap.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated case names")
    args = ap.parse_args()
    names = args.cases.split(",")
    cases = [c for c in CASES + EXTRA if c.name in names]
    dims = tuple(sorted({c.d for c in cases}))
    att = CUDAAttention.build(builtin("vanilla"), head_dims=dims, dtypes=("bfloat16", "bfloat16"),
                              kv_dtypes=("bfloat16", "float8_e4m3fn"), layouts=("NHD",), kernels=("decode",))
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = [r for case in cases for r in measure(att, case, gen)]
    info = run_info(args.commit)
    write_results(args.out, f"decode_breakdown_{info['date']}", {**info, "rows": rows}, markdown(info, rows))


if __name__ == "__main__":
    main()
