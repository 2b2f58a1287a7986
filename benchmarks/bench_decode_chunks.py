"""Decode chunk-length sweep: each case's time with the tensor-core template's even split into N chunks per
request, the load-balanced plan at several minimum chunk lengths (split requests merged by the decode kernel or by
the merge kernel), the CUDA-core template's even split, and FlashInfer's two decode paths in the same process.
The evidence behind ``schedules/cost_model.py`` ``DECODE_MIN_CHUNK``.

    python benchmarks/bench_decode_chunks.py out.json
"""
import json
import sys

import torch

import attngen.runtime.decode_plan as decode_plan
from attngen.runtime import CUDAAttention, PagedKV
from attngen.variants import builtin
from bench_decode import flashinfer_decode, make_case
from common import bench

# (head dim, query heads, KV heads, keys per request)
CASES = [(128, 32, 8, [2048]), (64, 32, 8, [2048]), (256, 16, 8, [2048]), (128, 32, 8, [8192]), (256, 16, 8, [8192]),
         (128, 32, 8, [512]), (128, 32, 8, [2048] * 4), (256, 16, 8, [4096] * 64), (256, 32, 8, [4096] * 16)]


def sweep(att, flashinfer, ws, d, hq, hkv, lens) -> dict:
    q, pages, indptr, indices, last = make_case(lens, hq, hkv, d)
    kv = PagedKV(pages, indptr, indices, last, "NHD")
    out, lse = torch.empty_like(q), torch.empty(q.shape[:2], device="cuda")
    res = {"case": f"D{d} Hq{hq} B{len(lens)} L{lens[0]}"}

    def timed(key, plan):
        res[key] = round(bench(lambda: att.decode(q, kv, plan=plan, out=out, lse=lse), reps=40) * 1e3, 2)

    auto = att.plan_decode(kv, hq, d)
    res["auto_chunks"] = auto.num_chunks
    timed("auto", auto)
    for n in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64):
        if lens[0] // n >= 32:
            timed(f"even{n}", att.plan_decode(kv, hq, d, tensor_cores=True, num_chunks=n))
    default = decode_plan.decode_min_chunk
    for mc in (64, 128, 256):
        decode_plan.decode_min_chunk = lambda head_dim, *rest, mc=mc: mc  # the planner's floor, for this sweep only
        for fused in (True, False):
            key = f"bal{mc}_{'f' if fused else 'm'}"
            plan = att.plan_decode(kv, hq, d, tensor_cores=True, fused_merge=fused)
            res[f"{key}_items"] = len(plan.split.work)
            timed(key, plan)
    decode_plan.decode_min_chunk = default
    for n in (4, 8, 16, 32):
        if lens[0] // n >= 32:
            timed(f"cc{n}", att.plan_decode(kv, hq, d, tensor_cores=False, num_chunks=n))
    for tc in (False, True):
        w = flashinfer_decode(flashinfer, ws, tc, indptr, indices, last, hq, hkv, d)
        key = f"fi_{'tc' if tc else 'cc'}"
        res[f"{key}_diff"] = float((w.run(q, pages).float() - out.float()).abs().max())
        res[key] = round(bench(lambda: w.run(q, pages), reps=40) * 1e3, 2)
    return res


def main() -> None:
    import flashinfer

    att = CUDAAttention.build(builtin("vanilla"), head_dims=(64, 128, 256), dtypes=("bfloat16",), layouts=("NHD",),
                              kernels=("decode",))
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    rows = []
    for d, hq, hkv, lens in CASES:
        rows.append(sweep(att, flashinfer, ws, d, hq, hkv, lens))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
