"""Prefill / append: attngen's templates (Hopper on sm_90a, the FA2-class mma.sync one) against FlashInfer
(fa2, fa3), PyTorch SDPA on cuDNN, and FlexAttention, in the same run with the same timer.

Cases (bf16, Hq 32 / Hkv 8, D 128 unless named): causal L 4k and 16k, full L 8k, causal L 8k at D 64
(Hq = Hkv = 16), causal L 8k at D 256 (Hq 16 / Hkv 8), fp16 causal L 8k, and a ragged batch of short
prompts of mixed length (causal). TFLOP/s of the visible work: 4 * D * Hq * (visible query-key pairs).
Writes ``prefill_<date>.{json,md,png}`` (the PNG: TFLOP/s by case and implementation).

    python benchmarks/bench_prefill.py --out benchmarks/results --commit <sha> [--no-peers]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from common import (bench, case_parser, cell, error_lines, flex_call, guarded, load_flashinfer, run_info,
                    selected_cases, write_results)


@dataclass(frozen=True)
class Case:
    name: str
    qo_lens: tuple[int, ...]  # one entry per request; keys = queries (self-attention prefill)
    causal: bool = True
    hq: int = 32
    hkv: int = 8
    d: int = 128
    dtype: str = "bfloat16"

    def visible_pairs(self) -> int:
        return sum(n * (n + 1) // 2 if self.causal else n * n for n in self.qo_lens)

    def flops(self) -> float:
        return 4.0 * self.d * self.hq * self.visible_pairs()


def _short_prompts() -> tuple[int, ...]:
    rng = np.random.default_rng(0)
    return tuple(int(x) for x in rng.integers(64, 1025, size=64))  # 64 prompts of 64..1024 tokens


CASES = [
    Case("causal L4k", (4096,)),
    Case("causal L16k", (16384,)),
    Case("full L8k", (8192,), causal=False),
    Case("causal L8k D64 Hq=Hkv=16", (8192,), hq=16, hkv=16, d=64),
    Case("causal L8k D256 Hq16/Hkv8", (8192,), hq=16, hkv=8, d=256),
    Case("causal L8k fp16", (8192,), dtype="float16"),
    Case("ragged 64 prompts 64-1024, causal", _short_prompts()),
]
PEERS = ("flashinfer_fa2", "flashinfer_fa3", "cudnn", "flex")


def make_inputs(case: Case):
    dt = getattr(torch, case.dtype)
    n = sum(case.qo_lens)
    q = torch.randn(n, case.hq, case.d, dtype=dt, device="cuda")
    k = torch.randn(n, case.hkv, case.d, dtype=dt, device="cuda")
    v = torch.randn(n, case.hkv, case.d, dtype=dt, device="cuda")
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(case.qo_lens)]), dtype=torch.int32, device="cuda")
    return q, k, v, indptr


def time_attngen(case: Case, libs: dict, q, k, v, indptr, template: str):
    from attngen.runtime import RaggedKV

    att = libs[(case.causal, case.d, case.dtype)]
    kv = RaggedKV(k, v, indptr)
    plan = att.plan_prefill(indptr, kv, case.d, template=template)
    out = torch.full_like(q, float("nan"))
    lse = torch.empty(q.shape[:2], device="cuda")
    ms = bench(lambda: att.prefill(q, kv, indptr, plan=plan, out=out, lse=lse), reps=20)
    return ms, out


def time_flashinfer(fi, case: Case, q, k, v, indptr, backend: str, ref):
    if len(case.qo_lens) == 1:
        fn = lambda: fi.single_prefill_with_kv_cache(q, k, v, causal=case.causal, backend=backend)  # noqa: E731
    else:
        ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
        w.plan(indptr, indptr, case.hq, case.hkv, case.d, causal=case.causal, q_data_type=q.dtype)
        fn = lambda: w.run(q, k, v)  # noqa: E731
    ms = bench(fn, reps=20)
    return ms, float((fn().float() - ref.float()).abs().max())


def time_cudnn(case: Case, q, k, v, ref):
    """SDPA on the cuDNN backend, one request at a time is not a peer: single-request cases only."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if len(case.qo_lens) != 1:
        raise RuntimeError("SDPA takes padded batches, not ragged ones; not timed on the ragged case")
    rep = case.hq // case.hkv
    qs = q.transpose(0, 1)[None]
    ks = k.repeat_interleave(rep, dim=1).transpose(0, 1)[None]  # cuDNN's SDPA path: equal head counts
    vs = v.repeat_interleave(rep, dim=1).transpose(0, 1)[None]
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        fn = lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=case.causal)  # noqa: E731
        ms = bench(fn, reps=20)
        diff = float((fn()[0].transpose(0, 1).float() - ref.float()).abs().max())
    return ms, diff


def time_flex(case: Case, q, k, v, indptr, ref):
    """FlexAttention (torch.compile'd) with its block mask: causal inside each request of the packed row."""
    doc = torch.repeat_interleave(torch.arange(len(case.qo_lens), device="cuda"),
                                  torch.tensor(case.qo_lens, device="cuda"))
    causal = case.causal

    def mask_mod(b, h, qi, ki):
        same = doc[qi] == doc[ki]
        return (same & (qi >= ki)) if causal else same

    fn, _ = flex_call(q, k, v, mask_mod)
    ms = bench(fn, reps=20)
    return ms, float((fn()[0].transpose(0, 1).float() - ref.float()).abs().max())


def plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    impls = ["attngen_hopper", "attngen_mma_sync", *PEERS]
    fig, ax = plt.subplots(figsize=(13, 5))
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        ax.bar([j + i * width for j in range(len(rows))], [r.get(impl) or 0 for r in rows], width, label=impl)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
    ax.set_xticklabels([r["case"] for r in rows], rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    args = case_parser(__doc__, "time attngen's templates only").parse_args()
    cases = selected_cases(CASES, args.cases)
    from attngen.runtime import CUDAAttention
    from attngen.variants import builtin

    torch.manual_seed(0)
    res = run_info(args.commit)
    fi = load_flashinfer()[0] if args.peers else None
    hopper = torch.cuda.get_device_capability()[0] == 9
    libs = {}
    for causal in sorted({c.causal for c in cases}):
        for d in sorted({c.d for c in cases}):
            dts = tuple(sorted({c.dtype for c in cases if c.d == d and c.causal == causal}))
            if dts:
                att = CUDAAttention.build(builtin("causal" if causal else "vanilla"), head_dims=(d,), dtypes=dts,
                                          layouts=("NHD",), kernels=("prefill",))
                libs.update({(causal, d, dt): att for dt in dts})
    rows = []
    for case in cases:
        q, k, v, indptr = make_inputs(case)
        row = {"case": case.name}
        flops = case.flops()
        ref = None
        for template in (("hopper",) if hopper else ()) + ("mma_sync",):
            ms, out = time_attngen(case, libs, q, k, v, indptr, template)
            row[f"attngen_{template}"] = flops / ms / 1e9
            if ref is None:
                ref = out
            else:
                row["hopper_vs_mma_sync_maxdiff"] = float((out.float() - ref.float()).abs().max())
        if args.peers:
            if fi is not None:
                for backend in ("fa2", "fa3"):
                    got = guarded(row, f"flashinfer_{backend}",
                                  lambda: time_flashinfer(fi, case, q, k, v, indptr, backend, ref))
                    if got:
                        row[f"flashinfer_{backend}"], row[f"flashinfer_{backend}_maxdiff"] = flops / got[0] / 1e9, got[1]
            got = guarded(row, "cudnn", lambda: time_cudnn(case, q, k, v, ref))
            if got:
                row["cudnn"], row["cudnn_maxdiff"] = flops / got[0] / 1e9, got[1]
            got = guarded(row, "flex", lambda: time_flex(case, q, k, v, indptr, ref))
            if got:
                row["flex"], row["flex_maxdiff"] = flops / got[0] / 1e9, got[1]
        rows.append(row)
        print(row, flush=True)
        report(args, res, rows)
        q = k = v = None  # free this case's tensors before the next
        torch.cuda.empty_cache()


def report(args, res: dict, rows: list[dict]) -> None:
    """Write the JSON, the Markdown table and the plot of the rows measured so far (called after every case, so a
    run cut off by a time limit keeps what it measured)."""
    res["rows"] = rows
    stem = f"prefill_{res['date']}{args.tag}"
    head = f"# Prefill — {res['gpu']}, {res['date']}, commit {res['commit']}"
    lines = [head, "",
             f"TFLOP/s of the visible work (device time, host ahead; medians). torch {res['torch']}, FlashInfer "
             f"{res['flashinfer']}. cuDNN: SDPA on its cuDNN backend (K/V heads repeated for it); flex: "
             "FlexAttention compiled, with its block mask.", "",
             "| case | attngen Hopper | attngen mma.sync | FlashInfer fa2 | FlashInfer fa3 | cuDNN | Flex | "
             "Hopper / best peer |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        best = max([r[p] for p in PEERS if r.get(p)], default=None)
        ratio = f"{r['attngen_hopper'] / best:.2f}" if best and r.get("attngen_hopper") else "—"
        lines.append(f"| {r['case']} | {cell(r.get('attngen_hopper'))} | {cell(r.get('attngen_mma_sync'))} | "
                     + " | ".join(cell(r.get(p)) for p in PEERS) + f" | {ratio} |")
    lines += error_lines(rows, lambda r: r["case"])
    write_results(args.out, stem, res, lines)
    guarded(res, "plot", lambda: plot(rows, args.out / f"{stem}.png"))


if __name__ == "__main__":
    main()
