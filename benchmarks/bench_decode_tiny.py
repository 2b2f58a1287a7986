"""Decode at tiny batches: attngen's automatic plan against FlashInfer's best decode wrapper.

Batch 1 (and 2) at 256-2048 keys, head dims 64 / 128 / 256: the shapes where a plan's chunk count decides the
time (a request cut in too few chunks leaves most SMs idle, one cut in too many pays the merge). Each row: the
plan's chunk count, device µs (medians) of attngen and of FlashInfer's CUDA-core and tensor-core decode wrappers,
and the largest difference of the outputs. Paged bf16 K/V (page 16, pages in a random order).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import flashinfer_decode, make_case  # noqa: E402
from common import bench, cell, guarded, load_flashinfer, result_parser, run_info, write_results  # noqa: E402

# (head dim, query heads, KV heads, KV length of each request)
CASES = [(128, 32, 8, [512]), (128, 32, 8, [1024]), (128, 32, 8, [2048]), (64, 32, 8, [512]),
         (256, 16, 8, [512]), (128, 32, 8, [256] * 2)]


def main():
    import torch

    from attngen.runtime import CUDAAttention, PagedKV
    from attngen.variants import builtin

    args = result_parser(__doc__).parse_args()
    flashinfer, _ = load_flashinfer()
    att = CUDAAttention.build(builtin("vanilla"), head_dims=(64, 128, 256), dtypes=("bfloat16",),
                              layouts=("NHD",), kernels=("decode",))
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    rows = []
    for d, hq, hkv, lens in CASES:
        q, pages, indptr, indices, last = make_case(lens, hq, hkv, d)
        kv = PagedKV(pages, indptr, indices, last, "NHD")
        out, lse = torch.empty_like(q), torch.empty(q.shape[:2], device="cuda")
        plan = att.plan_decode(kv, hq, d)
        row = {"case": f"D{d} B{len(lens)} L{lens[0]}", "chunks": plan.num_chunks,
               "attngen_us": bench(lambda: att.decode(q, kv, plan=plan, out=out, lse=lse), reps=60) * 1e3}
        for tc in (False, True):
            key = f"flashinfer_{'tc' if tc else 'cc'}"

            def peer():
                w = flashinfer_decode(flashinfer, ws, tc, indptr, indices, last, hq, hkv, d)
                row[f"{key}_maxdiff"] = float((w.run(q, pages).float() - out.float()).abs().max())
                return bench(lambda: w.run(q, pages), reps=60) * 1e3

            row[f"{key}_us"] = guarded(row, key, peer) if flashinfer else None
        rows.append(row)
        print(row, flush=True)
    info = run_info(args.commit)
    md = [f"# Decode at tiny batches — {info['gpu']}, {info['date']}, commit {args.commit}", "",
          "Device µs (medians), paged bf16 decode; `chunks`: the automatic plan's KV chunks per request.", "",
          "| case | chunks | attngen | FlashInfer CUDA-core | FlashInfer tensor-core | attngen / best FlashInfer |",
          "|---|---|---|---|---|---|"]
    for r in rows:
        peers = [x for x in (r["flashinfer_cc_us"], r["flashinfer_tc_us"]) if x]
        ratio = r["attngen_us"] / min(peers) if peers else None
        md.append(f"| {r['case']} | {r['chunks']} | {r['attngen_us']:.2f} | {cell(r['flashinfer_cc_us'], '.2f')} | "
                  f"{cell(r['flashinfer_tc_us'], '.2f')} | {cell(ratio, '.3f')} |")
    write_results(args.out, f"decode_tiny_{info['date']}", {**info, "rows": rows}, md)


if __name__ == "__main__":
    main()
