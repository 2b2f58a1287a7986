"""The CPU backend's decode and prefill against PyTorch's scaled_dot_product_attention on the same CPU.

float32 (or the case's dtype), paged K/V of 16-token pages in a random order, Hq 32 / Hkv 8 unless named. attngen
reads the pages in place; SDPA gets the same keys and values gathered into contiguous [B, Hkv, L, D] tensors
beforehand (the gather is not timed, which favours SDPA), GQA by ``enable_gqa``. Times: the best of ``--reps``
calls after one warm-up call, wall clock, on every core PyTorch uses (``torch.get_num_threads()``; attngen's
kernels run on TVM's thread pool, one thread per core). Each row also gives the largest difference of the two
outputs.

    python benchmarks/bench_cpu.py --commit $(git rev-parse --short HEAD)
"""
from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import case_parser, run_info, selected_cases, wall_times, write_results  # noqa: E402

PAGE = 16


@dataclass(frozen=True)
class Case:
    name: str
    kv_lens: tuple[int, ...]
    qo_lens: tuple[int, ...] | None = None  # None: decode (one query a request)
    hq: int = 32
    hkv: int = 8
    d: int = 128
    dtype: str = "float32"
    variant: str = "vanilla"  # "causal": each query row sees the keys up to its own position


CASES = [
    Case("decode B4 L2k", (2048,) * 4),
    Case("decode B1 L8k", (8192,)),
    Case("decode B16 L1k D64", (1024,) * 16, d=64),
    Case("decode B4 L2k bf16", (2048,) * 4, dtype="bfloat16"),
    Case("append 4 x 64 rows over 2k", (2048,) * 4, (64,) * 4),
    Case("prefill causal 1 x 512", (512,), (512,), variant="causal"),
]


def best(fn, reps: int) -> float:
    """The fastest of ``reps`` calls after one warm-up call, in seconds."""
    return min(wall_times(fn, reps))


def run_case(case: Case, reps: int, peers: bool) -> dict:
    import torch

    from attngen.runtime import CPUAttention, PagedKV
    from attngen.variants import builtin

    dt = getattr(torch, case.dtype)
    att = CPUAttention.build(builtin(case.variant), head_dims=(case.d,), dtypes=(case.dtype,), layouts=("NHD",))
    gen = torch.Generator().manual_seed(0)
    batch = len(case.kv_lens)
    pages_per = [-(-n // PAGE) for n in case.kv_lens]
    n_pages = sum(pages_per)
    pages = torch.randn(n_pages, 2, PAGE, case.hkv, case.d, generator=gen).to(dt)
    indices = torch.randperm(n_pages, generator=gen).int()
    indptr = torch.tensor([0] + [sum(pages_per[:i + 1]) for i in range(batch)], dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * PAGE for n, p in zip(case.kv_lens, pages_per)], dtype=torch.int32)
    kv = PagedKV(pages, indptr, indices, last, "NHD")
    rows = case.qo_lens or (1,) * batch
    q = torch.randn(sum(rows), case.hq, case.d, generator=gen).to(dt)
    if case.qo_lens is None:
        call = lambda: att.decode(q, kv)  # noqa: E731
    else:
        qo = torch.tensor([0] + [sum(rows[:i + 1]) for i in range(batch)], dtype=torch.int32)
        call = lambda: att.prefill(q, kv, qo)  # noqa: E731
    keys = sum(case.kv_lens)
    row = {"case": case.name, "bytes": 2 * keys * case.hkv * case.d * pages.element_size(),
           "flops": 4 * sum(r * n for r, n in zip(rows, case.kv_lens)) * case.hq * case.d}
    if case.variant == "causal":
        row["flops"] = 4 * sum(r * (n - r) + r * (r + 1) // 2 for r, n in zip(rows, case.kv_lens)) * case.hq * case.d
    row["attngen_s"] = best(call, reps)
    out = call()[0]
    if peers:
        ks, outs = [], []
        start = 0
        for b, (n, r) in enumerate(zip(case.kv_lens, rows)):
            ids = indices[indptr[b]:indptr[b + 1]].long()
            k = pages[ids, 0].reshape(-1, case.hkv, case.d)[:n].transpose(0, 1).unsqueeze(0).contiguous()
            v = pages[ids, 1].reshape(-1, case.hkv, case.d)[:n].transpose(0, 1).unsqueeze(0).contiguous()
            qb = q[start:start + r].transpose(0, 1).unsqueeze(0)
            ks.append((qb, k, v, n, r))
            start += r

        def sdpa():
            outs.clear()
            for qb, k, v, n, r in ks:
                mask = None
                if case.variant == "causal":  # query row i at position n - r + i sees keys 0 .. n - r + i
                    pos = torch.arange(n - r, n).unsqueeze(1)
                    mask = torch.arange(n).unsqueeze(0) <= pos
                outs.append(torch.nn.functional.scaled_dot_product_attention(qb, k, v, attn_mask=mask,
                                                                             enable_gqa=True))
        row["sdpa_s"] = best(sdpa, reps)
        ref = torch.cat([o[0].transpose(0, 1) for o in outs])
        row["max_diff"] = float((ref.float() - out.float()).abs().max())
    return row


def markdown(res: dict, rows: list[dict]) -> list[str]:
    lines = [f"# CPU backend against PyTorch SDPA on the CPU — {res['cpu']}, {res['threads']} threads, {res['date']}, "
             f"commit {res['commit']}", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             "| case | attngen ms | SDPA ms | attngen / SDPA (time) | attngen GB/s of K/V | attngen GFLOP/s | "
             "max diff |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        sd = r.get("sdpa_s")
        lines.append(f"| {r['case']} | {r['attngen_s'] * 1e3:.2f} | {sd * 1e3:.2f} | {r['attngen_s'] / sd:.2f} | "
                     f"{r['bytes'] / r['attngen_s'] / 1e9:.2f} | {r['flops'] / r['attngen_s'] / 1e9:.1f} | "
                     f"{r['max_diff']:.2g} |" if sd else
                     f"| {r['case']} | {r['attngen_s'] * 1e3:.2f} | — | — | {r['bytes'] / r['attngen_s'] / 1e9:.2f} | "
                     f"{r['flops'] / r['attngen_s'] / 1e9:.1f} | — |")
    return lines


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main():
    import torch

    ap = case_parser(__doc__, "time attngen alone")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per case (the best counts)")
    args = ap.parse_args()
    res = run_info(args.commit) | {"cpu": cpu_name(), "threads": torch.get_num_threads(), "cores": os.cpu_count()}
    rows = [run_case(c, args.reps, args.peers) for c in selected_cases(CASES, args.cases)]
    res["rows"] = rows
    write_results(args.out, f"cpu_{res['date']}{args.tag}", res, markdown(res, rows))


if __name__ == "__main__":
    main()
