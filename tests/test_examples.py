"""Every example runs (small sizes) and checks itself against the reference."""
import runpy
from pathlib import Path

import pytest

# tvm_model_e2e.py has a test of its own (tests/test_tvm_model_e2e.py, with its results named)
EXAMPLES = sorted(p for p in (Path(__file__).parent.parent / "examples").glob("*.py") if p.stem != "tvm_model_e2e")


def test_examples_exist():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path, build_cache):
    module = runpy.run_path(str(path))  # not as __main__: main() is called below with small sizes
    results = module["main"](head_dim=32, cache=build_cache)
    assert results and all(r["out_err"] < 1e-4 for r in results.values())
