"""Comparison of attention results that may hold NaN / Inf with the float64 reference's rules.

The rules (attngen.runtime.reference._softmax_rows): a row with no live key is exactly O = 0, lse = -inf;
a NaN or +inf score poisons its row (O and lse NaN); a non-finite value of a visible key makes the output
columns it enters non-finite. So: lse must be NaN, -inf and finite exactly where the reference's is; O must
be non-finite exactly where the reference's is (Inf and NaN are not told apart: which of the two a column
holds depends on the order of a sum), and close to it elsewhere.
"""
from __future__ import annotations

import numpy as np


def compare_nonfinite(out, lse, ref_out, ref_lse, *, tol: float, lse_tol: float, what: str) -> None:
    out = np.asarray(out, dtype=np.float64)
    lse = np.asarray(lse, dtype=np.float64)
    for name, got, want in (("lse NaN", np.isnan(lse), np.isnan(ref_lse)),
                            ("lse -inf (rows with no live key)", np.isneginf(lse), np.isneginf(ref_lse)),
                            ("lse +inf", np.isposinf(lse), np.isposinf(ref_lse)),
                            ("non-finite O", ~np.isfinite(out), ~np.isfinite(ref_out))):
        if not np.array_equal(got, want):
            bad = np.argwhere(got != want)[:5].tolist()
            raise AssertionError(f"{what}: {name} at {int(got.sum())} places, the reference at {int(want.sum())} "
                                 f"(first differences at {bad})")
    fin = np.isfinite(ref_out)
    err = float(np.abs(out[fin] - ref_out[fin]).max()) if fin.any() else 0.0
    lfin = np.isfinite(ref_lse)
    lse_err = float(np.abs(lse[lfin] - ref_lse[lfin]).max()) if lfin.any() else 0.0
    if err > tol or lse_err > lse_tol:
        raise AssertionError(f"{what}: max |O - ref| = {err:.3g} (tol {tol:.3g}) over finite places, "
                             f"max |lse - ref| = {lse_err:.3g} (tol {lse_tol:.3g})")
