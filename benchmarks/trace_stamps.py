"""What the Hopper trace tools (trace_hopper_items.py, trace_hopper_tail.py) share: a copy of a source tree's
``attngen`` with stamps added at source anchors of its CUDA headers, and each case run in a child process that
imports the copy, its stamp lines collected from the child's standard output (device printf)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from common import result_parser


def instrument(tree: Path, dst: Path, patches, tool: str) -> None:
    """Copies tree's attngen into dst and applies ``patches`` ((file under attngen/csrc, anchor, replacement), in
    order) there; an anchor not found exactly once stops the tool, naming it."""
    shutil.copytree(tree / "attngen", dst / "attngen", ignore=shutil.ignore_patterns("__pycache__"))
    texts = {}
    for name, anchor, replacement in patches:
        s = texts.get(name) or (dst / "attngen" / "csrc" / name).read_text()
        if s.count(anchor) != 1:
            raise SystemExit(f"{tool}: anchor found {s.count(anchor)} times in {name} (expected once): "
                             f"{anchor[:80]!r}")
        texts[name] = s.replace(anchor, replacement)
    for name, s in texts.items():
        (dst / "attngen" / "csrc" / name).write_text(s)


@contextmanager
def traced_cases(tree: str, patches, tool: str, script: str, prefix: str):
    """Within: run(name) runs ``script --case name`` in a child process importing an instrumented copy of
    ``tree`` and returns the child's lines starting with ``prefix`` (a failing child stops the tool)."""
    with tempfile.TemporaryDirectory() as tmp:
        instrument(Path(tree).resolve(), Path(tmp), patches, tool)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, str(Path(script).resolve().parent),
                                                          os.environ.get("PYTHONPATH", "")]))

        def run(name: str) -> list[str]:
            r = subprocess.run([sys.executable, script, "--case", name], capture_output=True, text=True, env=env,
                               timeout=600)
            if r.returncode:
                raise SystemExit(f"{name}: rc {r.returncode}\n{r.stderr[-3000:]}")
            return [ln for ln in r.stdout.splitlines() if ln.startswith(prefix)]

        yield run


def parse_or_run_case(doc: str, cases, run_case):
    """A trace tool's arguments (``result_parser``'s, --tree, --cases, and --case for the child process); with
    --case, runs that case (``run_case``) in this process and returns None."""
    ap = result_parser(doc)
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent), help="a tree holding attngen/")
    ap.add_argument("--cases", default=",".join(cases))
    ap.add_argument("--case", help="(internal) run one case in this process")
    args = ap.parse_args()
    if args.case:
        run_case(args.case)
        return None
    return args
