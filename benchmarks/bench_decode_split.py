"""Even split-KV of a uniform decode batch: chunks per request against the load-balanced plan.

The shape of the model-level benchmark's attention (bench_tvm_model.py): batch 32, 2058 keys each, Hq 32 / Hkv 8,
D 128, float16, 16-token pages in NHD and HND, pages in random and in sequential order. Rows: the tensor-core
template's load-balanced plan, the runtime's automatic choice, and its even-split grid launch with 1 to 4 chunks
per request (the split TVM's "tirx" decode slot must choose without the key lengths on the host: csrc/
device_info.cuh even_decode_chunks). GB/s of K/V read; device time with the host ahead (common.bench).

    python benchmarks/bench_decode_split.py --out benchmarks/results --commit <sha>
"""
from __future__ import annotations

from common import bench, result_parser, run_info, write_results

B, L, HQ, HKV, D, PS = 32, 2058, 32, 8, 128, 16
SPLITS = (("balanced plan", dict(tensor_cores=True)), ("automatic", {}),
          *((f"even {c}", dict(tensor_cores=True, num_chunks=c)) for c in (1, 2, 3, 4)))


def main():
    args = result_parser(__doc__).parse_args()
    import torch

    from attngen.runtime import CUDAAttention, PagedKV
    from attngen.variants import builtin

    att = CUDAAttention.build(builtin("vanilla"), head_dims=(D,), dtypes=("float16",), layouts=("NHD", "HND"))
    res = run_info(args.commit) | {"rows": []}
    pages_per = (L + PS - 1) // PS
    n = B * pages_per
    nbytes = B * L * HKV * D * 2 * 2
    for layout in ("HND", "NHD"):
        for order in ("random", "sequential"):
            shape = (n, 2, HKV, PS, D) if layout == "HND" else (n, 2, PS, HKV, D)
            pages = torch.randn(shape, dtype=torch.float16, device="cuda")
            idx = (torch.randperm(n) if order == "random" else torch.arange(n)).to(torch.int32).cuda()
            indptr = (torch.arange(B + 1, dtype=torch.int32) * pages_per).cuda()
            last = torch.full((B,), L - (pages_per - 1) * PS, dtype=torch.int32, device="cuda")
            kv = PagedKV(pages, indptr, idx, last, layout)
            q = torch.randn(B, HQ, D, dtype=torch.float16, device="cuda")
            out, lse = torch.empty_like(q), torch.empty(B, HQ, device="cuda")
            for key, kw in SPLITS:
                plan = att.plan_decode(kv, HQ, D, **kw)
                ms = bench(lambda: att.decode(q, kv, plan=plan, out=out, lse=lse))
                res["rows"].append({"layout": layout, "order": order, "split": key, "chunks": plan.num_chunks,
                                    "grid": plan.work is None, "us": ms * 1e3, "GBps": nbytes / ms / 1e6})
    lines = [f"# Decode split of a uniform batch (B {B} x {L} keys, Hq {HQ} / Hkv {HKV}, D {D}, float16, page {PS}) — "
             f"{res['gpu']}, {res['date']}, commit {res['commit']}", "",
             "| layout | page order | split | chunks | grid launch | us | GB/s |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['layout']} | {r['order']} | {r['split']} | {r['chunks']} | {r['grid']} | {r['us']:.1f} | "
              f"{r['GBps']:.0f} |" for r in res["rows"]]
    write_results(args.out, f"decode_split_{res['date']}", res, lines)


if __name__ == "__main__":
    main()
