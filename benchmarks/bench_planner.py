"""Host time of planning one decode step: attngen's split-KV planner and plan_decode vs FlashInfer's plan.

For B = 1, 64, 256 decode requests with random lengths (1..8k keys; Hq 32 / Hkv 8, D 128,
page 16, page ids drawn from a 4096-page pool), medians of ``time.perf_counter`` over many
calls (host wall time; nothing is timed on the device) of:

- the bare C++ planner (``SplitKVPlanner.plan`` with the arguments ``DecodeWorkspace.split``
  passes): the Python call, and the planner's own ``host_ns``;
- the C++ packer writing that plan into a bounded buffer with the fused merge's counters
  (``SplitKVPlanner.pack``, what ``DecodeWorkspace.fill`` runs before its copy);
- ``CUDAAttention.plan_decode`` in load-balanced mode (page-table checks, planner, packing,
  one asynchronous copy to the device);
- FlashInfer ``BatchDecodeWithPagedKVCacheWrapper.plan`` with ``use_tensor_cores`` False and True.

The last two get the same page table twice: on the host and on the device (where reading it
back costs a device-to-host copy). Without a GPU only the bare planner runs (with 33 plan
columns, the H200's). Writes JSON and a Markdown table.

    python benchmarks/bench_planner.py --out benchmarks/results --commit <sha>
"""
from __future__ import annotations

import json
import platform

import numpy as np

from common import (cell, error_lines, guarded, load_flashinfer, result_parser, run_info, wall_times,
                    write_results)

BATCHES = (1, 64, 256)
HQ, HKV, D, PAGE = 32, 8, 128, 16
MAX_LEN, POOL_PAGES = 8192, 4096
DEFAULT_CTAS = 33  # H200 without a GPU to ask: 2 tensor-core decode CTAs per SM x 132 SMs / 8 KV heads
PLACEMENTS = ("host", "device")  # where the page table lives when the plan call gets it


def median_us(fn, reps=200) -> float:
    """Median host wall time of ``fn`` in microseconds, after ten untimed calls."""
    return float(np.median(wall_times(fn, reps, warmup=10)) * 1e6)


def page_table(rng, batch: int):
    """(kv lengths [B], indptr [B+1], indices, last_page_len [B]) as int32 NumPy arrays."""
    lens = rng.integers(1, MAX_LEN, batch).astype(np.int32)
    n_pages = (lens + PAGE - 1) // PAGE
    indptr = np.concatenate([[0], np.cumsum(n_pages)]).astype(np.int32)
    indices = rng.integers(0, POOL_PAGES, int(indptr[-1])).astype(np.int32)
    return lens, indptr, indices, (lens - (n_pages - 1) * PAGE).astype(np.int32)


def plan_columns() -> int:
    """Plan columns (CTAs per KV head) of the load-balanced decode on this GPU, as plan_decode sizes them."""
    import torch

    from attngen.runtime.decode_plan import decode_tc_ctas_per_sm

    props = torch.cuda.get_device_properties(0)
    per_sm = decode_tc_ctas_per_sm(D, props.shared_memory_per_multiprocessor, props.shared_memory_per_block_optin)
    return max(1, per_sm * props.multi_processor_count // HKV)


def time_bare_planner(row: dict, lens, num_ctas: int, reps: int) -> None:
    from attngen.runtime.decode_plan import MIN_CHUNK, DecodeBounds
    from attngen.runtime.planner import PackedLayout, SplitKVPlanner

    n = len(lens)
    planner = SplitKVPlanner(DecodeBounds(max_batch=n, num_ctas=num_ctas).capacity)
    qo = np.ones(n, np.int32)

    def call():
        return planner.plan(qo, lens, num_ctas=num_ctas, group=HQ // HKV, tile_rows=16, min_chunk=MIN_CHUNK)

    row["attngen_python_call_us"] = median_us(call, reps)
    row["attngen_cxx_us"] = float(np.median([call().host_ns for _ in range(reps)]) / 1e3)
    plan = call()
    row["attngen_work_items"] = len(plan.work)
    layout = PackedLayout("bounded", merge_counter_heads=HKV, fused_merge=True)
    buf = np.zeros(planner.layout_ints(layout), np.int32)
    row["attngen_pack_us"] = median_us(lambda: planner.pack(plan, buf, layout), reps)


def time_gpu_plans(row: dict, att, flashinfer, table, reps: int) -> None:
    import torch

    from attngen.runtime import PagedKV

    _, indptr, indices, last = table
    pages = torch.empty(POOL_PAGES, 2, PAGE, HKV, D, dtype=torch.bfloat16, device="cuda")
    bf16 = torch.bfloat16
    for where in PLACEMENTS:
        dev = "cpu" if where == "host" else "cuda"
        ip, ix, lp = (torch.as_tensor(a, device=dev) for a in (indptr, indices, last))
        kv = PagedKV(pages, ip, ix, lp, "NHD")
        key = f"attngen_plan_decode_{where}"
        row[f"{key}_us"] = guarded(row, key, lambda: median_us(lambda: att.plan_decode(kv, HQ, D), reps))
        if flashinfer is None:
            continue
        for tc in (False, True):
            key = f"flashinfer_{'tc' if tc else 'cuda_core'}_plan_{where}"

            def fi_plan(tc=tc):
                ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
                return median_us(lambda: w.plan(ip, ix, lp, HQ, HKV, D, PAGE, q_data_type=bf16, kv_data_type=bf16),
                                 reps)
            row[f"{key}_us"] = guarded(row, key, fi_plan)
        torch.cuda.synchronize()


def markdown(res: dict) -> list[str]:
    cols = [("attngen_cxx_us", "C++ planner (host_ns)"), ("attngen_python_call_us", "planner Python call"),
            ("attngen_pack_us", "packer Python call")]
    for where in PLACEMENTS:
        cols += [(f"attngen_plan_decode_{where}_us", f"attngen plan_decode ({where} table)"),
                 (f"flashinfer_cuda_core_plan_{where}_us", f"FI plan, CUDA cores ({where} table)"),
                 (f"flashinfer_tc_plan_{where}_us", f"FI plan, tensor cores ({where} table)")]
    lines = [f"# Decode planning host time (µs, median), Hq {HQ} / Hkv {HKV}, D {D}, page {PAGE}, "
             f"lengths 1..{MAX_LEN} — {res['host']}, {res['gpu']}, {res['date']}, commit {res['commit']}", "",
             f"FlashInfer {res['flashinfer']}; {res['num_ctas']} plan columns (CTAs per KV head).", "",
             "| B | " + " | ".join(c for _, c in cols) + " |", "|---|" + "---|" * len(cols)]
    for r in res["cases"]:
        lines.append(f"| {r['batch']} | " + " | ".join(cell(r.get(k), ".1f") for k, _ in cols) + " |")
    return lines + error_lines(res["cases"], lambda r: f"B {r['batch']}")


def main():
    ap = result_parser(__doc__)
    ap.add_argument("--reps", type=int, default=200, help="timed calls per measurement")
    args = ap.parse_args()
    import torch

    gpu = torch.cuda.is_available()
    res = run_info(args.commit)
    res["host"] = f"{platform.processor() or platform.machine()} ({platform.node()})"
    res["num_ctas"] = plan_columns() if gpu else DEFAULT_CTAS
    res["cases"] = []
    att = flashinfer = None
    if gpu:
        from attngen.runtime import CUDAAttention
        from attngen.variants import builtin

        att = CUDAAttention.build(builtin("vanilla"), head_dims=(D,), dtypes=("bfloat16",), layouts=("NHD",),
                                  kernels=("decode",))
        flashinfer, _ = load_flashinfer()
    rng = np.random.default_rng(0)
    for batch in BATCHES:
        table = page_table(rng, batch)
        row = {"batch": batch, "keys": int(table[0].sum())}
        time_bare_planner(row, table[0], res["num_ctas"], args.reps)
        if gpu:
            time_gpu_plans(row, att, flashinfer, table, args.reps)
        res["cases"].append(row)
        print(json.dumps(row), flush=True)
    write_results(args.out, f"planner_{res['date']}", res, markdown(res))


if __name__ == "__main__":
    main()
