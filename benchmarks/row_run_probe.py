"""How fast the GPU's memory serves short runs: a paged KV pool's rows gathered in four orders, the same rows and
bytes each time (PyTorch's index_select over 8-byte words, device events, medians: common.bench).

A pool of 16-token pages in NHD layout, [pages, 16, Hkv, R bytes] (Hkv 8; R the bytes of one KV head's row: 64 /
128 / 256 / 512, i.e. e4m3 at D 64 / 128 / 256 / 512 or 16-bit at half those). Every row is copied once, in the
order of:

* ``pool``: the pool as it lies (one long run; the copy baseline of this kernel);
* ``page-major``: pages in a random order, each page whole (runs of PAGE x Hkv x R bytes: every head's CTA
  reading the same page at once);
* ``token-major``: (page, token) pairs in a random order, each token's Hkv rows together (runs of Hkv x R bytes:
  a kernel reading every head of a token at once);
* ``head-major``: a KV head at a time, pages in a random order (runs of R bytes at a stride of Hkv x R: what one
  CTA per KV head sees when its siblings read elsewhere).

GB/s counts the rows' bytes read and written and the int32 indices read. The decode kernels read each head's
rows from its own CTA, the siblings at about the same time (between page-major and head-major); a gap between
head-major and page-major at R = 128 that closes at 256 says short runs, not the kernel's work, hold the fp8
decode at D 128 (docs/fp8.md).

    python benchmarks/row_run_probe.py --out benchmarks/results --commit <sha>
"""
from __future__ import annotations

import torch

from common import bench, result_parser, run_info, write_results

PAGE, HKV = 16, 8
TOTAL = 1 << 30  # bytes of the pool (each order copies all of it)
ROW_BYTES = (64, 128, 256, 512)


def orders(pages: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """The int32 row indices [pages * PAGE * HKV] of each order (row id = (page * PAGE + token) * HKV + head), on
    ``gen``'s device."""
    dev = gen.device
    tok = torch.arange(PAGE, device=dev)
    head = torch.arange(HKV, device=dev)
    perm = torch.randperm(pages, device=dev, generator=gen)
    page_major = ((perm[:, None, None] * PAGE + tok[None, :, None]) * HKV + head[None, None, :]).reshape(-1)
    tokens = torch.randperm(pages * PAGE, device=dev, generator=gen)
    token_major = (tokens[:, None] * HKV + head[None, :]).reshape(-1)
    head_major = ((perm[None, :, None] * PAGE + tok[None, None, :]) * HKV + head[:, None, None]).reshape(-1)
    found = {"pool": torch.arange(pages * PAGE * HKV, device=dev), "page-major": page_major,
             "token-major": token_major, "head-major": head_major}
    return {name: idx.to(torch.int32) for name, idx in found.items()}


def time_orders(r: int, gen: torch.Generator) -> dict:
    """GB/s of each order over a pool of rows of ``r`` bytes (the copy checked against the gathered rows)."""
    rows = TOTAL // r
    src = torch.randint(-2**62, 2**62, (rows, r // 8), dtype=torch.int64, device="cuda", generator=gen)
    dst = torch.empty_like(src)
    row = {"row_bytes": r}
    for name, idx in orders(rows // (PAGE * HKV), gen).items():
        ms = bench(lambda: torch.index_select(src, 0, idx, out=dst), reps=20)  # noqa: B023 (called here only)
        assert torch.equal(dst, src[idx]), name
        row[name] = (2 * TOTAL + 4 * idx.numel()) / (ms * 1e-3) / 1e9
    return row


def main():
    args = result_parser(__doc__).parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    res = run_info(args.commit) | {"total_bytes": TOTAL, "rows": []}
    for r in ROW_BYTES:
        res["rows"].append(time_orders(r, gen))
        torch.cuda.empty_cache()
    lines = [f"# Row-run probe — {res['gpu']}, {res['date']}, commit {args.commit}", "",
             "GB/s (rows read + written, indices read) of index_select over a 1 GiB NHD pool of 16-token pages, "
             "Hkv 8, in four orders (benchmarks/row_run_probe.py).", "",
             "| row bytes | pool | page-major | token-major | head-major | head-major / page-major |",
             "|---|---|---|---|---|---|"]
    for row in res["rows"]:
        lines.append(f"| {row['row_bytes']} | {row['pool']:.0f} | {row['page-major']:.0f} | {row['token-major']:.0f} | "
                     f"{row['head-major']:.0f} | {row['head-major'] / row['page-major']:.2f} |")
    write_results(args.out, f"row_run_probe_{res['date']}", res, lines)


if __name__ == "__main__":
    main()
