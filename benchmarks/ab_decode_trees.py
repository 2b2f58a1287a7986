"""Decode A/B of a source tree: the automatic plan of every ``bench_decode.py`` case on the library that the given
tree's own ``attngen`` builds (vanilla, bf16, NHD, decode only), FlashInfer's CUDA-core and tensor-core decode beside
it with ``--fi``. Run it once per tree in one device session and compare the rows (``ab_trees.py`` does the same
for whole prefill + decode libraries at D 128).

    python benchmarks/ab_decode_trees.py /path/to/tree out.json [--fi] [--dims=256] [--cases=D256,gqa B1]
"""
import json
import sys
import time

tree, out_path = sys.argv[1], sys.argv[2]
sys.path.insert(0, tree)  # this tree's attngen, not an installed one
sys.path.insert(1, "benchmarks")
import torch  # noqa: E402

import attngen  # noqa: E402
from attngen.runtime import CUDAAttention, PagedKV  # noqa: E402
from attngen.variants import builtin  # noqa: E402
from bench_decode import CASES, make_case  # noqa: E402
from common import bench  # noqa: E402


def option(name: str) -> list[str]:
    return [a.split("=", 1)[1] for a in sys.argv if a.startswith(f"--{name}=")]


def main() -> None:
    print("attngen from", attngen.__file__, flush=True)
    t0 = time.time()
    dims = [int(d) for d in option("dims")] or [64, 128, 256]
    libs = {d: CUDAAttention.build(builtin("vanilla"), head_dims=(d,), dtypes=("bfloat16",), layouts=("NHD",),
                                   kernels=("decode",)) for d in dims}
    print("build", round(time.time() - t0, 1), flush=True)
    fi = None
    if "--fi" in sys.argv:
        import flashinfer as fi
        ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    prefixes = option("cases")[0].split(",") if option("cases") else []
    rows = []
    for c in CASES:
        if c.d not in libs or (prefixes and not any(c.name.startswith(p) for p in prefixes)):
            continue
        att = libs[c.d]
        q, pages, indptr, indices, last = make_case(c.kv_lens, c.hq, c.hkv, c.d)
        kv = PagedKV(pages, indptr, indices, last, "NHD")
        nbytes = sum(c.kv_lens) * c.hkv * c.d * 4 + 2 * q.numel() * 2
        out, lse = torch.empty_like(q), torch.empty(q.shape[:2], device="cuda")
        plan = att.plan_decode(kv, c.hq, c.d)
        r = {"case": c.name, "chunks": plan.num_chunks, "grid": plan.work is None}
        r["us"] = round(bench(lambda: att.decode(q, kv, plan=plan, out=out, lse=lse), reps=40) * 1e3, 2)
        r["GBps"] = round(nbytes / r["us"] / 1e3)
        if fi is not None:
            best = None
            for tc in (False, True):
                w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
                w.plan(indptr, indices, last, c.hq, c.hkv, c.d, 16, q_data_type=torch.bfloat16,
                       kv_data_type=torch.bfloat16)
                r["fi_diff"] = float((w.run(q, pages).float() - out.float()).abs().max())
                us = bench(lambda: w.run(q, pages), reps=40) * 1e3
                r["fi_tc" if tc else "fi_cc"] = round(us, 2)
                best = us if best is None else min(best, us)
            r["ratio"] = round(best / r["us"], 3)
        print(json.dumps(r), flush=True)
        rows.append(r)
        del q, pages, kv
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
