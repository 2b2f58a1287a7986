"""Where a split append's time goes on the Hopper template: a clock trace of every CTA of one launch.

A verify step (a few query tokens over a long cache) runs as the tail split: each CTA takes one piece of an
item's keys, leaves its partial state in a slot, counts itself, and the piece that counts last merges every slot
and stores the rows (csrc/hopper_tail.cuh). This script copies a source tree's ``attngen`` into a temporary
directory, adds stamps there (the tree itself is not touched), builds the causal variant from the copy and runs
verify B1 q8 kv8k and q4 kv2k (bf16, Hq 32 / Hkv 8, D 128, pages of 16 in random order; ``benchmarks/
bench_append.py``'s inputs). Per CTA, in SM clock cycles from the CTA's start (thread 0's ``clock64``): its pieces
loaded (after the start's ``__syncthreads``), the producer's first K/V issue, consumer 0's item received, its first
K tile landed, its main loop's end, its count returned (split pieces), its merge's end (the piece that counted
last) and its rows stored; and ``%globaltimer`` at the start and at the end, which place the CTAs on one time line.
The Markdown gives each stamp's minimum / median / maximum over the CTAs, and the merging CTAs' own line.
A launch that records prints nothing: each CTA prints its stamps at the start of its next launch, and the case runs
four launches (the third is read). Device printf at the end of each CTA of the traced launch itself had held
other CTAs' counts back by up to 100 us (the first trace, 2026-12-07, q4 kv2k: 100 CTAs without a piece printed
while 32 counted).

    python benchmarks/trace_hopper_tail.py --tree . --out benchmarks/results [--commit <sha>]

Writes ``hopper_tail_trace_<date>.{json,md}``. The stamps are inserted at source anchors; a kernel change that
moves one makes the script stop with the anchor it could not find.
"""
from __future__ import annotations

import datetime
import re
import statistics as st
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trace_stamps  # noqa: E402
from common import write_results  # noqa: E402

CASES = ("q8_kv8k", "q4_kv2k")
STAMPS = ("pieces", "first_issue", "item", "first_k", "main_end", "counted", "merged", "stored")  # clock64, 1..8

DECLS = """namespace attngen {

// (trace_hopper_tail.py) per CTA: clock64 at the start and at eight points, %globaltimer at the start, clock64 and
// %globaltimer at the end; and the CTA's launches so far (even ones record, odd ones print the one before)
static __device__ unsigned long long ag_ts[1024][12];
static __device__ unsigned ag_launch[1024];
static __device__ __forceinline__ unsigned long long ag_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
static __device__ __forceinline__ void ag_stamp(int k) {
  if (blockIdx.x < 1024) ag_ts[blockIdx.x][k] = clock64();
}
"""

HAND_ON = "  if (cw == 0) named_sync(kTurnBar, 256);  // the second consumer's hand-on after its last turn\n"

# (file, anchor, replacement) applied in order
PATCHES = [
    ("hopper_tail.cuh", "namespace attngen {\n", DECLS),
    ("hopper_prefill.cuh", "  __syncthreads();\n",
     "  __syncthreads();\n  if (tid == 0) ag_stamp(1);\n"),
    ("hopper_prefill.cuh", "  if (tid == 0) {\n    *tail_count",
     "  if (tid == 0 && blockIdx.x < 1024) {\n"
     "    unsigned long long* a = ag_ts[blockIdx.x];\n"
     "    if (ag_launch[blockIdx.x]++ & 1) {\n"
     "      printf(\"AGTS %d %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu\\n\", int(blockIdx.x), a[0], "
     "a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[10], a[9], a[11]);\n"
     "    } else {\n"
     "      for (int k = 1; k < 9; ++k) a[k] = 0;\n"
     "      a[0] = clock64();\n      a[9] = ag_now();\n    }\n  }\n"
     "  if (tid == 0) {\n    *tail_count"),
    ("hopper_prefill.cuh", "        if (n >= NS) mbar_wait(&empty_k[s], drained);\n",
     "        if (ptid == 0 && n == 0) ag_stamp(2);\n        if (n >= NS) mbar_wait(&empty_k[s], drained);\n"),
    ("hopper_prefill.cuh", "    const HopperItem w = warp_uniform_item(ring[qs]);\n",
     "    const HopperItem w = warp_uniform_item(ring[qs]);\n    if (tid == 128 && qn == 0) ag_stamp(3);\n"),
    ("hopper_prefill.cuh", "    auto wait_k = [&](int kt) {\n      mbar_wait(&full_k[stage(kt)], phase(kt));\n",
     "    auto wait_k = [&](int kt) {\n      mbar_wait(&full_k[stage(kt)], phase(kt));\n"
     "      if (tid == 128 && it + kt == 0) ag_stamp(4);\n"),
    ("hopper_prefill.cuh", "    mbar_arrive(&empty_q[qs]);  // every S of the item",
     "    if (tid == 128) ag_stamp(5);\n    mbar_arrive(&empty_q[qs]);  // every S of the item"),
    ("hopper_tail.cuh", "  last = __shfl_sync(0xffffffffu, last, 0);\n",
     "  last = __shfl_sync(0xffffffffu, last, 0);\n  if (threadIdx.x == 128) ag_stamp(6);\n"),
    ("hopper_tail.cuh", "cw, ctid, o_acc, m_row, d_row);\n      if (level == 0)",
     "cw, ctid, o_acc, m_row, d_row);\n      if (cw == 0 && ctid == 0) ag_stamp(7);\n      if (level == 0)"),
    # (a spread plan's pieces: 6 once every piece of the item has counted, 7 after the stripe's merge)
    ("hopper_tail.cuh", "  __syncwarp();  // lane 0's acquire before every lane's slot loads\n}\n",
     "  __syncwarp();  // lane 0's acquire before every lane's slot loads\n"
     "  if (threadIdx.x == 128) ag_stamp(6);\n}\n"),
    ("hopper_tail.cuh", "      hopper_tail_merge_stripe<T, D>(t, first, count, j, cw, ctid, o_acc, m_row, d_row);\n",
     "      hopper_tail_merge_stripe<T, D>(t, first, count, j, cw, ctid, o_acc, m_row, d_row);\n"
     "      if (cw == 0 && ctid == 0) ag_stamp(7);\n"),
    ("hopper_prefill.cuh", "      hopper_store_rows<V, T, D>(o_acc, lse_row, w, wrow, P, hp, scratch, lane, finish);\n",
     "      hopper_store_rows<V, T, D>(o_acc, lse_row, w, wrow, P, hp, scratch, lane, finish);\n"
     "      if (tid == 128) ag_stamp(8);\n"),
    ("hopper_prefill.cuh", HAND_ON,
     HAND_ON +
     "  if (tid == 128 && blockIdx.x < 1024) {\n"
     "    ag_ts[blockIdx.x][10] = clock64();\n    ag_ts[blockIdx.x][11] = ag_now();\n  }\n"),
]


def instrument(tree: Path, dst: Path) -> None:
    """Copies tree's attngen into dst and adds the stamps there."""
    trace_stamps.instrument(tree, dst, PATCHES, "trace_hopper_tail")


def run_case(name: str) -> None:
    """In a child process: build the copy's causal variant and run the case four times, synchronising after each
    (the third launch's stamps, which the fourth prints, count)."""
    import numpy as np
    import torch

    import bench_append as ba
    from attngen.runtime import CUDAAttention, PagedKV
    from attngen.variants import builtin

    qo_len, kv_len = {"q8_kv8k": (8, 8192), "q4_kv2k": (4, 2048)}[name]
    att = CUDAAttention.build(builtin("causal"), head_dims=(128,), dtypes=("bfloat16",), layouts=("NHD",),
                              kernels=("prefill",))
    q, cache, pind, order, last, qind = ba.make_inputs(ba.Case(name, 1, qo_len, kv_len), np.random.default_rng(0))
    kv = PagedKV(cache, pind, order, last, "NHD")
    plan = att.plan_prefill(qind, kv, ba.D, template="hopper")
    for _ in range(4):  # record, print, record, print
        att.prefill(q, kv, qind, plan=plan)
        torch.cuda.synchronize()
    print(f"AGSM {torch.cuda.get_device_properties(0).multi_processor_count}", flush=True)


def summarize(rows: list[list[int]]) -> dict:
    """Per stamp, microseconds from the CTA's start (its own cycles, at the launch's median cycles per ns):
    minimum / median / maximum over the CTAs that reached it; and each CTA's start and end on the launch's time line
    (%globaltimer, from the first CTA's start)."""
    # row: cta, c0, c1..c8, c_end, g_start, g_end
    out = {"ctas": len(rows)}
    rate = st.median((r[10] - r[1]) / max(r[12] - r[11], 1) for r in rows)  # cycles per ns
    out["cycles_per_ns"] = rate
    for k, label in enumerate(STAMPS, start=2):
        us = [(r[k] - r[1]) / rate / 1e3 for r in rows if r[k] >= r[1] and r[k] != 0]
        out[label] = ([min(us), st.median(us), max(us)], len(us)) if us else ([0, 0, 0], 0)
    ends = [(r[10] - r[1]) / rate / 1e3 for r in rows]
    out["end"] = ([min(ends), st.median(ends), max(ends)], len(ends))
    g0 = min(r[11] for r in rows)
    starts = [(r[11] - g0) / 1e3 for r in rows]
    finish = [(r[12] - g0) / 1e3 for r in rows]
    out["launch_start"] = ([min(starts), st.median(starts), max(starts)], len(rows))
    out["launch_end"] = ([min(finish), st.median(finish), max(finish)], len(rows))
    out["merging"] = [{label: round((r[k] - r[1]) / rate / 1e3, 2) for k, label in enumerate(STAMPS, start=2)
                       if r[k] >= r[1] and r[k] != 0}
                      | {"end": round((r[10] - r[1]) / rate / 1e3, 2), "starts_at": round((r[11] - g0) / 1e3, 2),
                         "ends_at": round((r[12] - g0) / 1e3, 2)}
                      for r in rows if r[8] >= r[1] and r[8] != 0]
    return out


def main():
    args = trace_stamps.parse_or_run_case(__doc__, CASES, run_case)
    if args is None:
        return
    date = datetime.date.today().isoformat()
    results = {"date": date, "commit": args.commit, "tree": args.tree, "stamps": STAMPS, "cases": {}}
    md = [f"# Hopper tail split, every CTA of one launch — {date}, commit {args.commit}", "",
          "Microseconds from each CTA's start (its own clock, converted at the launch's median cycles per ns), "
          "min / median / max over the CTAs that reach the point; the third of four launches. bf16, Hq 32 / Hkv 8, "
          "D 128, causal, pages of 16. `benchmarks/trace_hopper_tail.py`.", ""]
    with trace_stamps.traced_cases(args.tree, PATCHES, "trace_hopper_tail", __file__, "AGTS ") as run:
        for name in args.cases.split(","):
            lines = run(name)
            if not lines or len(lines) % 2:
                raise SystemExit(f"{name}: {len(lines)} trace lines, not two printing launches' worth")
            rows = [[int(x) for x in re.findall(r"\d+", ln)] for ln in lines[-len(lines) // 2:]]
            s = summarize(rows)
            results["cases"][name] = {"summary": s, "rows": rows}
            md += [f"## verify B1 {name.replace('_', ' ')} ({s['ctas']} CTAs, {s['cycles_per_ns']:.2f} cycles per ns)",
                   "", "| point | CTAs | min | median | max |", "|---|---|---|---|---|"]
            md += [f"| {label} | {s[label][1]} | " + " | ".join(f"{x:.2f}" for x in s[label][0]) + " |"
                   for label in (*STAMPS, "end", "launch_start", "launch_end")]
            md += ["", "The CTAs that merged: " + "; ".join(str(m) for m in s["merging"]), ""]
    write_results(args.out, f"hopper_tail_trace_{date}", results, md)


if __name__ == "__main__":
    main()
