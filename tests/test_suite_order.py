"""The GPU suite's order (tests/conftest.py ``_templates_apart``): cases of one test function parametrized over
the prefill template run one template's cases before the next's, every other case keeps its place."""
from types import SimpleNamespace

from .conftest import _templates_apart


def case(nodeid: str, **params):
    return SimpleNamespace(nodeid=nodeid, callspec=SimpleNamespace(params=params) if params else None)


def test_a_functions_template_halves_run_apart_and_everything_else_keeps_its_place():
    items = [case("a.py::t_first"),
             case("a.py::t_pair[x-mma_sync]", name="x", template="mma_sync"),
             case("a.py::t_pair[x-hopper]", name="x", template="hopper"),
             case("a.py::t_pair[y-mma_sync]", name="y", template="mma_sync"),
             case("a.py::t_pair[y-hopper]", name="y", template="hopper"),
             case("a.py::t_other[1]", n=1),
             case("b.py::t_pair[z-hopper]", name="z", template="hopper"),
             case("b.py::t_pair[z-mma_sync]", name="z", template="mma_sync"),
             case("b.py::t_last")]
    _templates_apart(items)
    assert [i.nodeid for i in items] == [
        "a.py::t_first", "a.py::t_pair[x-mma_sync]", "a.py::t_pair[y-mma_sync]", "a.py::t_pair[x-hopper]",
        "a.py::t_pair[y-hopper]", "a.py::t_other[1]", "b.py::t_pair[z-hopper]", "b.py::t_pair[z-mma_sync]",
        "b.py::t_last"]
