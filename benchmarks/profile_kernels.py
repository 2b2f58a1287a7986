"""One launch of each hot kernel, for a profiler (ncu) to inspect.

Runs attngen's causal prefill (L 4k, bf16, D 128, Hq 32 / Hkv 8) and paged decode
(B 16, L 16k, page 16) a few times each, so that `ncu -k regex:... -s 2 -c 1` sees a warm launch.
``--decode-case`` picks another case of bench_decode.py for the decode; ``--peer`` also runs
FlashInfer's tensor-core decode on it, so one ncu run compares launch shapes (grid, registers, shared
memory, occupancy) and achieved bandwidth of both.

    ncu --section SpeedOfLight -k regex:prefill -s 2 -c 1 python benchmarks/profile_kernels.py
    ncu --section LaunchStats --section Occupancy --section SpeedOfLight -k regex:"decode|Prefill" \
        python benchmarks/profile_kernels.py --decode-case "gqa B64 L4k" --peer

``--mask full --length 8192`` profiles full attention instead (bench_prefill.py's "full L 8k"); ``--prefill-peer``
also runs FlashInfer's fa3 prefill on the same inputs, so one ncu run (``-k regex:[Pp]refill``) profiles both;
``--kv-dtype float8_e4m3fn`` runs both the prefill and the decode over e4m3 K/V (scales 1), the fp8 paths
of both templates:

    ncu --set full -k regex:hopper_prefill -s 2 -c 1 python benchmarks/profile_kernels.py --kv-dtype float8_e4m3fn
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_decode import CASES as DECODE_CASES, PAGE, make_case  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--narrow", action="store_true", help="plan prefill with 64-row tiles")
    ap.add_argument("--decode-case", default="gqa B16 L16k", help="a case name of bench_decode.py")
    ap.add_argument("--peer", action="store_true", help="also run FlashInfer's tensor-core decode")
    ap.add_argument("--prefill-peer", action="store_true",
                    help="also run FlashInfer's fa3 prefill on the prefill's inputs (bf16 K/V)")
    ap.add_argument("--mask", choices=("causal", "full"), default="causal", help="the prefill's mask")
    ap.add_argument("--length", type=int, default=4096, help="the prefill's one request: queries = keys")
    ap.add_argument("--kv-dtype", default="bfloat16", choices=("bfloat16", "float8_e4m3fn"),
                    help="K/V element type of the prefill and the decode (fp8: scales 1)")
    args = ap.parse_args()
    from attngen.runtime import CUDAAttention, PagedKV, RaggedKV
    from attngen.variants import builtin

    fp8 = args.kv_dtype != "bfloat16"
    build = dict(head_dims=(128,), dtypes=("bfloat16",), layouts=("NHD",),
                 kv_dtypes=(args.kv_dtype,) if fp8 else ())
    scales = dict(k_scale=1.0, v_scale=1.0) if fp8 else {}
    kv_type = getattr(torch, args.kv_dtype)
    prefill_lib = CUDAAttention.build(builtin("causal" if args.mask == "causal" else "vanilla"), **build)
    L, hq, hkv, D = args.length, 32, 8, 128
    q = torch.randn(L, hq, D, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(L, hkv, D, dtype=torch.bfloat16, device="cuda").to(kv_type) for _ in range(2))
    indptr = torch.tensor([0, L], dtype=torch.int32, device="cuda")
    kv = RaggedKV(k, v, indptr)
    plan = prefill_lib.plan_prefill(indptr, kv, D, wide_tiles=False if args.narrow else None)
    for _ in range(3):
        prefill_lib.prefill(q, kv, indptr, plan=plan, **scales)
    if args.prefill_peer:
        import flashinfer

        for _ in range(3):
            flashinfer.single_prefill_with_kv_cache(q, k, v, causal=args.mask == "causal", backend="fa3")
    vanilla = CUDAAttention.build(builtin("vanilla"), **build)
    cases = {c.name: (c.kv_lens, c.hq, c.hkv) for c in DECODE_CASES if c.d == D}
    if args.decode_case not in cases:
        raise SystemExit(f"--decode-case: one of {sorted(cases)}")
    lens, dq, dkv = cases[args.decode_case]
    qd, pages, pindptr, indices, last = make_case(lens, dq, dkv)
    pkv = PagedKV(pages.to(kv_type), pindptr, indices, last, "NHD")
    dplan = vanilla.plan_decode(pkv, qd.shape[1], D)
    for _ in range(3):
        vanilla.decode(qd, pkv, plan=dplan, **scales)
    if args.peer:
        import flashinfer

        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"),
                                                          "NHD", use_tensor_cores=True)
        w.plan(pindptr, indices, last, dq, dkv, D, PAGE, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        for _ in range(3):
            w.run(qd, pages)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
