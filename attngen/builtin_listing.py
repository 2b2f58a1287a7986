"""The table ``attngen list`` prints (each built-in variant's name, mask class and one-line description),
shipped with the package so that listing needs no TVM.

The mask class comes from the variant analysis (TVM's TIR); computing the table imports TVM and every
built-in, seconds of start-up. ``variants/listing.json`` holds the table and the key it was computed
under: a hash of what decides it (the built-ins' sources, the variant IR and its analyses, the installed
TVM). ``shipped_rows`` returns the table when that key still holds, else None (the caller computes it,
``compute_rows``). tests/test_cli.py checks that the shipped table equals the computed one; after an edit
of the built-ins or the analyses, write it again with ``python -m attngen.builtin_listing``.
"""
from __future__ import annotations

import json
from pathlib import Path

from attngen.codegen.cache import content_key, hash_files, package_version

PACKAGE = Path(__file__).resolve().parent
LISTING = PACKAGE / "variants" / "listing.json"


def listing_key() -> str:
    """What the table is a function of: the built-ins, the IR package (analyses) and TVM's version."""
    files = [*(PACKAGE / "variants").glob("*.py"), *(PACKAGE / "ir").glob("*.py")]
    return content_key({"sources": hash_files(files, root=PACKAGE), "tvm": package_version("apache-tvm")})


def shipped_rows(key: str | None = None) -> list[list[str]] | None:
    """The shipped table, when it was computed under the current key; None when stale or absent."""
    try:
        data = json.loads(LISTING.read_text())
    except (OSError, ValueError):
        return None
    return data["rows"] if data.get("key") == (key or listing_key()) else None


def compute_rows() -> list[list[str]]:
    """[name, mask class, description] of every built-in (imports TVM)."""
    from attngen.variants import BUILTINS, builtin

    variants = {name: builtin(name) for name in BUILTINS}
    return [[name, v.analysis.mask.kind.value, v.doc] for name, v in variants.items()]


def write_listing() -> Path:
    LISTING.write_text(json.dumps({"key": listing_key(), "rows": compute_rows()}, indent=1) + "\n")
    return LISTING


if __name__ == "__main__":
    print(f"wrote {write_listing()}")
