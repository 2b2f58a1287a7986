"""Shared-prefix decode on the GPU: attngen cascade vs attngen flat decode vs FlashInfer cascade / flat decode.

bf16, Hq 32 / Hkv 8, D 128, page 16; every request holds one shared prefix (whole pages) and its own
128-key suffix. The same cache serves every method, only the page tables differ (no data is copied):

- attngen flat: the load-balanced decode over each request's full page table (the prefix pages
  repeated in every table), the reference of the "max |diff|" column;
- attngen cascade (API): ``CascadeAttention.plan(levels, mode="cascade")`` and ``run`` on every
  call, two levels (prefix shared by all rows, suffix per request): host checks with
  device-to-host copies of the page tables each time;
- attngen cascade (planned): ``CascadeAttention.plan`` once, ``run(q, plan=plan)`` timed: the
  shared prefix split into chunks run by one launch, their states merged;
- attngen cascade (mode auto): planned once with the default mode, which runs flat (one decode
  over the concatenated page lists) where the cascade would save under CASCADE_MIN_SAVED_BYTES;
- attngen cascade (unsplit): the same with ``max_chunks=1`` (the prefix not split);
- attngen prefix prefill + suffix decode: level 0 as above, level 1 by the load-balanced decode;
- FlashInfer ``MultiLevelCascadeAttentionWrapper`` (2 levels) and flat
  ``BatchDecodeWithPagedKVCacheWrapper`` (tensor cores).

Device-event medians after warm-up, the host ahead of the GPU (benchmarks/common.py). GB/s counts unique bytes: the prefix
and the suffixes once, q read and the output written once. Writes JSON and a Markdown table.

    python benchmarks/bench_cascade.py --out benchmarks/results --commit <sha>
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from common import (bench, cell, copy_bandwidth, error_lines, guarded, host_us, load_flashinfer, result_parser,
                    run_info, write_results)

CASES = [  # (name, batch, shared prefix keys)
    ("B64 prefix 32k", 64, 32768),
    ("B16 prefix 1k", 16, 1024),
]
HQ, HKV, D, PAGE, SUFFIX = 32, 8, 128, 16, 128
METHODS = [  # (result key, Markdown column)
    ("attngen_flat", "attngen flat decode"),
    ("attngen_cascade_api", "attngen cascade (API)"),
    ("attngen_cascade_planned", "attngen cascade (planned)"),
    ("attngen_cascade_auto", "attngen cascade (planned, mode auto)"),
    ("attngen_cascade_unsplit", "attngen cascade (planned, prefix unsplit)"),
    ("attngen_prefill_decode", "attngen prefix prefill + suffix decode"),
    ("flashinfer_cascade", "FI cascade (2 levels)"),
    ("flashinfer_flat_tc", "FI flat decode (TC)"),
]


@dataclass
class SharedPrefixCase:
    """One cache and three page tables over it: the shared level, the suffix level and the flat view."""

    q: object  # [B, HQ, D]
    pages: object  # [num_pages, 2, PAGE, HKV, D]
    shared_qo: object  # [2] int32: all B query rows form one group
    shared: object  # PagedKV, one page list (the prefix)
    suffix_qo: object  # [B+1] int32: one row per group
    suffix: object  # PagedKV, one page list per request
    flat: object  # PagedKV, prefix + suffix pages of every request
    unique_bytes: int
    logical_bytes: int  # what a flat read of every request's full table moves


def make_case(batch: int, prefix: int):
    import torch

    from attngen.runtime import PagedKV

    if prefix % PAGE:
        raise ValueError(f"prefix {prefix}: the shared prefix must fill whole pages of {PAGE}")
    p_pages, s_pages = prefix // PAGE, -(-SUFFIX // PAGE)
    last = SUFFIX - (s_pages - 1) * PAGE
    n_pages = p_pages + batch * s_pages
    dev = "cuda"
    i32 = dict(dtype=torch.int32, device=dev)
    pages = torch.randn(n_pages, 2, PAGE, HKV, D, dtype=torch.bfloat16, device=dev)
    perm = torch.randperm(n_pages, device=dev).to(torch.int32)  # pages scattered over the pool
    prefix_ids, suffix_ids = perm[:p_pages], perm[p_pages:].reshape(batch, s_pages)
    lasts = torch.full((batch,), last, **i32)
    shared = PagedKV(pages, torch.tensor([0, p_pages], **i32), prefix_ids.contiguous(), torch.tensor([PAGE], **i32))
    suffix = PagedKV(pages, torch.arange(batch + 1, **i32) * s_pages, suffix_ids.reshape(-1).contiguous(), lasts)
    flat_ids = torch.cat([prefix_ids.expand(batch, p_pages), suffix_ids], 1).reshape(-1).contiguous()
    flat = PagedKV(pages, torch.arange(batch + 1, **i32) * (p_pages + s_pages), flat_ids, lasts)
    q = torch.randn(batch, HQ, D, dtype=torch.bfloat16, device=dev)
    key_bytes = HKV * D * 2 * 2  # K and V, bf16
    io_bytes = 2 * q.numel() * 2
    return SharedPrefixCase(q, pages, torch.tensor([0, batch], **i32), shared, torch.arange(batch + 1, **i32), suffix,
                            flat, (prefix + batch * SUFFIX) * key_bytes + io_bytes,
                            batch * (prefix + SUFFIX) * key_bytes + io_bytes)


def attngen_runners(att, c: SharedPrefixCase) -> dict:
    """Setup functions (untimed: plans, buffers) returning the timed call, which returns the output."""
    import torch

    from attngen.runtime import CascadeAttention, CascadeLevel, merge_state

    levels = [CascadeLevel(c.shared_qo, c.shared), CascadeLevel(c.suffix_qo, c.suffix)]

    def flat():
        plan = att.plan_decode(c.flat, HQ, D)
        out, lse = torch.empty_like(c.q), torch.empty(c.q.shape[:2], device="cuda")
        return lambda: att.decode(c.q, c.flat, plan=plan, out=out, lse=lse)[0]

    def cascade_api():  # levels given to every call: host checks and plans each time
        cascade = CascadeAttention(att)
        return lambda: cascade.run(c.q, plan=cascade.plan(levels, int(c.q.shape[0]), D, mode="cascade"))[0]

    def cascade_planned():  # planned once (the shared prefix split into chunks), run per layer
        cascade = CascadeAttention(att)
        plan = cascade.plan(levels, int(c.q.shape[0]), D, mode="cascade")
        return lambda: cascade.run(c.q, plan=plan)[0]

    def cascade_auto():  # mode "auto": flat (a decode over the concatenated page lists) where the cascade saves little
        cascade = CascadeAttention(att)
        plan = cascade.plan(levels, int(c.q.shape[0]), D, num_qo_heads=HQ)
        print(f"  auto chose {plan.mode}", flush=True)
        return lambda: cascade.run(c.q, plan=plan)[0]

    def cascade_unsplit():  # planned once, the shared prefix not split (one CTA column per query tile)
        cascade = CascadeAttention(att)
        plan = cascade.plan(levels, int(c.q.shape[0]), D, max_chunks=1, mode="cascade")
        return lambda: cascade.run(c.q, plan=plan)[0]

    def prefill_decode():
        p0 = att.plan_prefill(c.shared_qo, c.shared, D)
        p1 = att.plan_decode(c.suffix, HQ, D)  # supersedes the flat plan (one workspace per shape): runs after it

        def run():
            out, lse = att.prefill(c.q, c.shared, c.shared_qo, plan=p0)
            o1, s1 = att.decode(c.q, c.suffix, plan=p1)
            return merge_state(out, lse, o1, s1)[0]
        return run

    return {"attngen_flat": flat, "attngen_cascade_api": cascade_api, "attngen_cascade_planned": cascade_planned,
            "attngen_cascade_auto": cascade_auto,
            "attngen_cascade_unsplit": cascade_unsplit, "attngen_prefill_decode": prefill_decode}


def flashinfer_runners(flashinfer, c: SharedPrefixCase) -> dict:
    import torch

    bf16 = torch.bfloat16

    def cascade():
        ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        w = flashinfer.MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
        w.plan([c.shared_qo, c.suffix_qo], [c.shared.indptr, c.suffix.indptr], [c.shared.indices, c.suffix.indices],
               [c.shared.last_page_len, c.suffix.last_page_len], HQ, HKV, D, PAGE, causal=False,
               q_data_type=bf16, kv_data_type=bf16)
        return lambda: w.run(c.q, c.pages)

    def flat_tc():
        ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
        w.plan(c.flat.indptr, c.flat.indices, c.flat.last_page_len, HQ, HKV, D, PAGE, q_data_type=bf16,
               kv_data_type=bf16)
        return lambda: w.run(c.q, c.pages)

    return {"flashinfer_cascade": cascade, "flashinfer_flat_tc": flat_tc}


def measure(row: dict, key: str, setup, c: SharedPrefixCase, ref, reps: int):
    """Time one method; record ms, GB/s of unique bytes and max |out - ref|. Returns its output (or None)."""
    import torch

    def go():
        fn = setup()
        out = fn()  # first call: JIT / library loads, and the output for the sanity column
        torch.cuda.synchronize()
        ms = bench(fn, reps=reps)
        row[f"{key}_ms"] = ms
        row[f"{key}_GBps"] = c.unique_bytes / (ms * 1e-3) / 1e9
        row[f"{key}_host_us"] = host_us(fn)
        if ref is not None:
            row[f"{key}_maxdiff"] = float((out.float() - ref).abs().max())
        return out

    return guarded(row, key, go)


def markdown(res: dict) -> list[str]:
    head = " | ".join(col for _, col in METHODS)
    lines = [f"# Shared-prefix decode, bf16, Hq {HQ} / Hkv {HKV}, D {D}, page {PAGE}, suffix {SUFFIX} keys — "
             f"{res['gpu']}, {res['date']}, commit {res['commit']}", "",
             f"FlashInfer {res['flashinfer']}; copy bandwidth in the same run: {cell(res.get('copy_GBps'))} GB/s. "
             "Cells: device ms per call, the host ahead of the GPU (GB/s of unique bytes: the prefix and each "
             "suffix once); \"API\" synchronises on the device-to-host copies of its per-call checks, so its time "
             "includes them; \"planned\" is plan once, run per layer. Host µs per call: `*_host_us` in the JSON.", "",
             f"| case | unique MB | {head} |", "|---|---|" + "---|" * len(METHODS)]
    for r in res["cases"]:
        cells = [f"{cell(r.get(f'{k}_ms'), '.3f')} ({cell(r.get(f'{k}_GBps'))})" for k, _ in METHODS]
        lines.append(f"| {r['case']} | {r['unique_bytes'] / 1e6:.0f} | " + " | ".join(cells) + " |")
    lines += ["", "Max |output - attngen flat| (sanity):", "", f"| case | {head} |", "|---|" + "---|" * len(METHODS)]
    for r in res["cases"]:
        lines.append(f"| {r['case']} | " + " | ".join(cell(r.get(f"{k}_maxdiff"), ".2e") for k, _ in METHODS) + " |")
    return lines + error_lines(res["cases"], lambda r: r["case"])


def main():
    ap = result_parser(__doc__)
    ap.add_argument("--reps", type=int, default=50, help="timed launches per method (the API row uses a fifth)")
    args = ap.parse_args()
    import torch

    from attngen.runtime import CUDAAttention
    from attngen.variants import builtin

    res = run_info(args.commit)
    res.update(heads=(HQ, HKV), head_dim=D, page_size=PAGE, suffix=SUFFIX, cases=[])
    res["copy_GBps"] = copy_bandwidth()
    att = CUDAAttention.build(builtin("vanilla"), head_dims=(D,), dtypes=("bfloat16",), layouts=("NHD",))
    flashinfer, _ = load_flashinfer()
    for name, batch, prefix in CASES:
        c = make_case(batch, prefix)
        row = {"case": name, "batch": batch, "prefix": prefix, "unique_bytes": c.unique_bytes,
               "logical_bytes": c.logical_bytes}
        runners = attngen_runners(att, c)
        if flashinfer is not None:
            runners.update(flashinfer_runners(flashinfer, c))
        ref_out = measure(row, "attngen_flat", runners.pop("attngen_flat"), c, None, args.reps)
        ref = None if ref_out is None else ref_out.float().clone()
        for key, setup in runners.items():
            measure(row, key, setup, c, ref, max(5, args.reps // 5) if key == "attngen_cascade_api" else args.reps)
        res["cases"].append(row)
        print(json.dumps(row), flush=True)
        del c, runners, ref_out, ref
        torch.cuda.empty_cache()
    write_results(args.out, f"cascade_{res['date']}", res, markdown(res))


if __name__ == "__main__":
    main()
