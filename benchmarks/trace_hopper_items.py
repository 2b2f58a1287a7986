"""Where the Hopper prefill's time goes per work item: a clock trace of one persistent CTA (CTA 0).

The script copies a source tree's ``attngen`` into a temporary directory, adds clock64 stamps to
``csrc/hopper_prefill.cuh`` there (the tree itself is not touched), builds the causal and the causal
sliding-window variants from the copy and runs these cases: one causal row of L 8k, the same row under a
window of 1024 keys, bench_prefill.py's ragged batch of short prompts, bench_packed_docs.py's 16 documents in one
16k row under the document mask (its tile map: the mapped instance) and the same documents as separate causal
requests (bf16, Hq 32 / Hkv 8, D 128). At the
end of each launch CTA 0 prints one line per item it ran: the producer's item decoding, query copy and K/V
issue, and per consumer warpgroup its wait for the query rows, the time to its first turn at the tensor cores,
its main loop, its epilogue, and the cycles it spent waiting for turns and for K / V stages. Cycles are SM
clocks; the stamps cost a little, so compare traces with each other, not with bench_prefill.py's timings.

    python benchmarks/trace_hopper_items.py --tree . --out benchmarks/results [--cases causal,window,ragged]
    (window<N>: a causal window of N keys, e.g. window4096)

Writes ``hopper_item_trace_<date>.{json,md}`` (every item's line in the JSON). The stamps are inserted at
source anchors; a kernel change that moves one makes the script stop with the anchor it could not find.
"""
from __future__ import annotations

import datetime
import re
import runpy
import statistics as st
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trace_stamps  # noqa: E402
from common import write_results  # noqa: E402

CASES = ("causal", "window", "ragged", "docs", "docs_ragged")
WINDOW = 1024

# (anchor, replacement) pairs applied in order to csrc/hopper_prefill.cuh
STAMPS = [
    ("namespace attngen {\n\n// Mapped:", """namespace attngen {

__device__ unsigned long long ag_tr[3][1024][8];  // [producer, consumer 0, consumer 1][item][stamp]
__device__ int ag_tr_n[3];

// Mapped:"""),
    ("    auto produce = [&](const HopperItem& w) {",
     """    bool ptr = false;  // (the traced item's: set in the rounds, read inside produce)
    int pslot = 0;
    auto produce = [&](const HopperItem& w) {"""),
    ("""      HopperItem w;
      if (!item_at(idx, w, n >= 0)) {""",
     """      HopperItem w;
      const unsigned long long pt0 = clock64();
      if (!item_at(idx, w, n >= 0)) {"""),
    ("""      if (n >= 0) hopper_tail_cut<TK>(tail_pieces[n], w);
      produce(w);""",
     """      if (n >= 0) hopper_tail_cut<TK>(tail_pieces[n], w);
      ptr = blockIdx.x == 0 && tid == 0 && qn < 1024;
      pslot = qn;
      if (ptr) { ag_tr[0][pslot][0] = pt0; ag_tr[0][pslot][1] = clock64(); ag_tr[0][pslot][5] = w.num_kt; }
      produce(w);
      if (ptr) { ag_tr[0][pslot][3] = clock64(); ag_tr_n[0] = pslot + 1; }"""),
    ("""        ++qn;
      }
      SinkShift""", """        ++qn;
        if (ptr) ag_tr[0][pslot][2] = clock64();
      }
      SinkShift"""),
    ("""    const int qs = qn % NQ;
    mbar_wait(&full_q[qs], (qn / NQ) & 1);""", """    const int qs = qn % NQ;
    const bool ctr = blockIdx.x == 0 && (tid == 128 || tid == 256) && qn < 1024;
    const int ci = tid == 128 ? 1 : 2;
    unsigned long long cwait_turn = 0, cwait_kv = 0;
    if (ctr) ag_tr[ci][qn][0] = clock64();
    mbar_wait(&full_q[qs], (qn / NQ) & 1);
    if (ctr) ag_tr[ci][qn][1] = clock64();"""),
    ("    auto turn_begin = [&]() { named_sync(kTurnBar + cw, 256); };",
     "    auto turn_begin = [&]() { const unsigned long long t_ = clock64(); named_sync(kTurnBar + cw, 256); "
     "cwait_turn += clock64() - t_; };"),
    ("    auto wait_k = [&](int kt) {", "    auto wait_k_raw = [&](int kt) {"),
    ("    auto wait_v = [&](int kt) {", "    auto wait_v_raw = [&](int kt) {"),
    ("    if (n_active > 0) {\n", """    auto wait_k = [&](int kt) { const unsigned long long t_ = clock64(); wait_k_raw(kt); cwait_kv += clock64() - t_; };
    auto wait_v = [&](int kt) { const unsigned long long t_ = clock64(); wait_v_raw(kt); cwait_kv += clock64() - t_; };
    if (n_active > 0) {
"""),
    ("""      wait_k(0);
      turn_begin();
      issue_s(stage(0));""", """      wait_k(0);
      turn_begin();
      if (ctr) ag_tr[ci][qn][2] = clock64();
      issue_s(stage(0));"""),
    ("    mbar_arrive(&empty_q[qs]);  // every S of the item has completed",
     "    if (ctr) ag_tr[ci][qn][3] = clock64();\n    mbar_arrive(&empty_q[qs]);  // every S of the item has completed"),
    ("""    it += num_kt;
    ++qn;
  }
""", """    if (ctr) { ag_tr[ci][qn][4] = clock64(); ag_tr[ci][qn][5] = cwait_turn; ag_tr[ci][qn][6] = cwait_kv; ag_tr_n[ci] = qn + 1; }
    it += num_kt;
    ++qn;
  }
"""),
    ("  if (cw == 0) named_sync(kTurnBar, 256);  // the second consumer's hand-on after its last turn",
     """  if (cw == 0) named_sync(kTurnBar, 256);  // the second consumer's hand-on after its last turn
  if (blockIdx.x == 0) {  // both consumer warpgroups: the stamps written, consumer 0 prints them
    __threadfence_block();
    asm volatile("bar.sync 9, 256;");
    if (tid == 128) {
      for (int r = 0; r < ag_tr_n[1]; ++r) {
        const unsigned long long* p = ag_tr[0][r];
        const unsigned long long* a = ag_tr[1][r];
        const unsigned long long* c = ag_tr[2][r];
        printf("AGTR %d %llu | %llu %llu %llu | %llu %llu %llu %llu %llu %llu | %llu %llu %llu %llu %llu %llu\\n", r, p[5],
               p[1] - p[0], p[2] - p[0], p[3] - p[0], a[1] - a[0], a[2] - a[0], a[3] - a[0], a[4] - a[0], a[5], a[6],
               c[1] - c[0], c[2] - c[0], c[3] - c[0], c[4] - c[0], c[5], c[6]);
      }
    }
  }"""),
]
FIELDS = ("item", "tiles", "p_decode", "p_query", "p_kv", *(f"c{c}_{k}" for c in (0, 1) for k in
          ("query_wait", "first_turn", "main_end", "end", "turn_waits", "kv_waits")))


def instrument(tree: Path, dst: Path) -> None:
    """Copies tree's attngen into dst and adds the stamps there."""
    trace_stamps.instrument(tree, dst, [("hopper_prefill.cuh", a, r) for a, r in STAMPS], "trace_hopper_items")


def run_case(name: str) -> None:
    """In a child process: build the copy's variant, run the case three times (the last launch's lines count)."""
    import torch

    from attngen.runtime import CUDAAttention, RaggedKV
    from attngen.variants import builtin
    from bench_prefill import CASES as PREFILL_CASES, make_inputs

    torch.manual_seed(0)
    params, variant = {}, builtin("causal")
    if name == "ragged":
        q, k, v, indptr = make_inputs([c for c in PREFILL_CASES if c.name.startswith("ragged")][0])
    elif name in ("docs", "docs_ragged"):  # bench_packed_docs.py's 16 documents in one 16k row
        import numpy as np

        from bench_packed_docs import doc_lengths

        L = 16384
        lens = doc_lengths(L, 16, np.random.default_rng(0))
        q = torch.randn(L, 32, 128, dtype=torch.bfloat16, device="cuda")
        k, v = (torch.randn(L, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        if name == "docs":  # one request, the document mask's tile map
            indptr = torch.tensor([0, L], dtype=torch.int32, device="cuda")
            variant = runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "document_mask.py"))["variant"]
            params = {"doc_ids": torch.repeat_interleave(torch.arange(16, dtype=torch.int32, device="cuda"),
                                                         torch.tensor(lens, device="cuda"))[None]}
        else:  # the same documents as separate causal requests
            indptr = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    else:
        L = 8192
        q = torch.randn(L, 32, 128, dtype=torch.bfloat16, device="cuda")
        k, v = (torch.randn(L, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        indptr = torch.tensor([0, L], dtype=torch.int32, device="cuda")
        if name.startswith("window"):  # "window" (1024 keys) or "window<N>", a causal window of N keys
            variant, params = builtin("sliding_window_causal"), {"window_left": int(name[6:] or WINDOW)}
    att = CUDAAttention.build(variant, head_dims=(128,), dtypes=("bfloat16",), layouts=("NHD",),
                              kernels=("prefill",))
    kv = RaggedKV(k, v, indptr)
    plan = att.plan_prefill(indptr, kv, 128, template="hopper")
    for _ in range(3):
        att.prefill(q, kv, indptr, plan=plan, params=params)
    torch.cuda.synchronize()


def summarize(rows: list[list[int]]) -> dict:
    """Per-item means and the main loops' cycles per key tile of one case's items. A consumer's stamps of an
    item count only when they are ordered (0 <= first turn <= main loop's end <= end): a consumer without rows in
    an item (a short request's last query tile) records none, and its slots hold whatever was there before."""
    f = {k: [r[i] for r in rows] for i, k in enumerate(FIELDS)}
    tiles = sum(f["tiles"])
    out = {"items": len(rows), "tiles": tiles, "p_decode": st.mean(f["p_decode"])}
    for c in (0, 1):
        ok = [i for i in range(len(rows))
              if 0 <= f[f"c{c}_first_turn"][i] <= f[f"c{c}_main_end"][i] <= f[f"c{c}_end"][i]]
        if not ok:
            out[f"c{c}"] = {"items": 0}
            continue
        pick = {k: [v[i] for i in ok] for k, v in f.items()}
        main = [e - t for e, t in zip(pick[f"c{c}_main_end"], pick[f"c{c}_first_turn"])]
        out[f"c{c}"] = {
            "items": len(ok), "tiles": sum(pick["tiles"]), "query_wait": st.mean(pick[f"c{c}_query_wait"]),
            "to_first_turn": st.mean(pick[f"c{c}_first_turn"]),
            "main_per_tile": sum(main) / max(sum(pick["tiles"]), 1),
            "epilogue": st.mean(e - m for e, m in zip(pick[f"c{c}_end"], pick[f"c{c}_main_end"])),
            "turn_waits": st.mean(pick[f"c{c}_turn_waits"]), "kv_waits": st.mean(pick[f"c{c}_kv_waits"])}
    return out


def table_row(name: str, c: int, s: dict) -> str:
    """One consumer's line of the Markdown table."""
    k = s[f"c{c}"]
    if not k["items"]:
        return f"| {name}, consumer {c} | 0 of {s['items']} | — | — | — | — | — | — | — | {s['p_decode']:.0f} |"
    return (f"| {name}, consumer {c} | {k['items']} of {s['items']} | {k['tiles']} | {k['main_per_tile']:.0f} | "
            f"{k['to_first_turn']:.0f} | {k['query_wait']:.0f} | {k['epilogue']:.0f} | "
            f"{k['turn_waits']:.0f} | {k['kv_waits']:.0f} | {s['p_decode']:.0f} |")


def main():
    args = trace_stamps.parse_or_run_case(__doc__, CASES, run_case)
    if args is None:
        return
    results = {"date": datetime.date.today().isoformat(), "commit": args.commit, "tree": args.tree, "cases": {}}
    md = [f"# Hopper prefill per-item trace (CTA 0) — {results['date']}, commit {args.commit}", "",
          "SM clock cycles, per item (means) of the last of three launches; bf16, Hq 32 / Hkv 8, D 128. "
          "`benchmarks/trace_hopper_items.py`.", "",
          "| case | items (consumer has rows) | key tiles | main loop per tile | to first turn | query wait | epilogue | turn waits "
          "| K/V waits | producer decode |", "|---|---|---|---|---|---|---|---|---|---|"]
    patches = [("hopper_prefill.cuh", a, r) for a, r in STAMPS]
    with trace_stamps.traced_cases(args.tree, patches, "trace_hopper_items", __file__, "AGTR ") as run:
        for name in args.cases.split(","):
            lines = run(name)
            starts = [i for i, ln in enumerate(lines) if ln.startswith("AGTR 0 ")]
            lines = lines[starts[-1]:] if starts else []
            if not lines:
                raise SystemExit(f"{name}: no trace lines")
            rows = [[int(x) for x in re.findall(r"\d+", ln)] for ln in lines]
            s = summarize(rows)
            results["cases"][name] = {"summary": s, "rows": rows}
            md.extend(table_row(name, c, s) for c in (0, 1))
    results["fields"] = FIELDS
    write_results(args.out, f"hopper_item_trace_{results['date']}", results, md)


if __name__ == "__main__":
    main()
