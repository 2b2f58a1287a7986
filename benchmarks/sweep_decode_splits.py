"""Batch-1 decode: attngen's automatic plan and its even splits (8-64 chunks, tensor-core and CUDA-core
templates, one or two KV heads a CTA at D 64; the load-balanced plan with its merge fused into the decode kernel
or in a merge kernel) against FlashInfer's CUDA-core and tensor-core decode, same run,
three interleaved rounds (device time, medians of benchmarks/common.py bench). Needs a GPU and FlashInfer.

    python benchmarks/sweep_decode_splits.py   # writes $OUT/sweep_b1.json (or /tmp)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import flashinfer  # noqa: E402
import torch  # noqa: E402
from bench_decode import flashinfer_decode, make_case  # noqa: E402
from common import bench  # noqa: E402

from attngen.runtime import CUDAAttention, PagedKV  # noqa: E402
from attngen.variants import builtin  # noqa: E402

out = {}
for name, kv_lens, hq, hkv, d in [("D64 B1 L2k", [2048], 32, 8, 64), ("D256 B1 L2k", [2048], 16, 8, 256),
                                  ("D128 B1 L2k", [2048], 32, 8, 128), ("D64 B1 L8k", [8192], 32, 8, 64)]:
    att = CUDAAttention.build(builtin("vanilla"), head_dims=(d,), dtypes=("bfloat16",), layouts=("NHD",),
                              kernels=("decode",))
    q, pages, indptr, indices, last = make_case(kv_lens, hq, hkv, d)
    kv = PagedKV(pages, indptr, indices, last, "NHD")
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], device="cuda")
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    fns = {}

    def call(p):  # one decode under plan p
        return lambda: att.decode(q, kv, plan=p, out=o, lse=lse)

    auto = att.plan_decode(kv, hq, d)
    fns[f"auto({auto.num_chunks})"] = call(auto)
    for fused in (True, False):  # the load-balanced plan, its merge in the decode kernel or a merge kernel
        fns[f"lb {'fused' if fused else 'merge kernel'}"] = call(att.plan_decode(kv, hq, d, fused_merge=fused))
    for ch in (8, 12, 16, 20, 24, 32, 48, 64):
        for pair in ((1, 2) if d == 64 else (1,)):
            for tc in (True, False):
                try:
                    p = att.plan_decode(kv, hq, d, num_chunks=ch, tensor_cores=tc,
                                        kv_heads_per_cta=pair if tc else None)
                except Exception as e:  # noqa: BLE001
                    print("skip", ch, pair, tc, e); continue
                fns[f"{'tc' if tc else 'cc'} ch{ch} h{pair}"] = call(p)
    for tc in (False, True):
        w = flashinfer_decode(flashinfer, ws, tc, indptr, indices, last, hq, hkv, d)
        fns[f"FI {'tc' if tc else 'cc'}"] = (lambda w: lambda: w.run(q, pages))(w)
    times = {k: [] for k in fns}
    for r in range(3):
        for k, f in fns.items():
            times[k].append(bench(f) * 1000)
    med = {k: sorted(v)[1] for k, v in times.items()}
    best_fi = min(v for k, v in med.items() if k.startswith("FI"))
    print(f"== {name}  best FI {best_fi:.2f} us")
    for k, v in sorted(med.items(), key=lambda kv_: kv_[1])[:14]:
        print(f"  {k:18s} {v:6.2f} us  {best_fi / v:5.3f}x FI")
    out[name] = med
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "sweep_b1.json"), "w"), indent=1)
