"""tests/conftest.py's shallow stacks for TVMScript's decorators: they hold the frames ``inspect.stack()`` holds,
with the same code lines where the parser reads them, and hooks, closures and ``@I.ir_module`` classes parse as
with TVM's own stacks."""
import inspect

import tvm
from tvm.script import ir as I
from tvm.script import tirx as T
from tvm.script.parser.ir import entry as ir_entry
from tvm.tirx.script.parser import entry as tir_entry

from .conftest import _shallow_tvmscript_stacks


def _both_stacks():
    return inspect.stack(), tir_entry.inspect.stack()


def test_the_stacks_hold_the_same_frames_and_the_parsers_lines():
    _shallow_tvmscript_stacks()
    assert tir_entry.inspect.stack is not inspect.stack and ir_entry.inspect.stack is tir_entry.inspect.stack
    full, shallow = _both_stacks()
    assert [f.frame for f in shallow] == [f.frame for f in full] and len(full) > 3
    assert [f.function for f in shallow] == [f.function for f in full]
    for i in range(3):  # the caller, its caller, and the third frame whose line the parser reads
        assert shallow[i].code_context == full[i].code_context and shallow[i].lineno == full[i].lineno


def test_hooks_closures_and_modules_parse_as_with_tvms_stacks():
    _shallow_tvmscript_stacks()
    cap = 30.0

    @T.prim_func
    def softcap(s: T.float32) -> T.float32:
        return cap * T.tanh(s / cap)

    assert isinstance(softcap, tvm.tirx.PrimFunc) and "30" in softcap.script()

    @I.ir_module
    class Module:
        @T.prim_func
        def add_one(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
            for i in range(4):
                b[i] = a[i] + T.float32(1)

    assert isinstance(Module, tvm.IRModule) and [g.name_hint for g in Module.get_global_vars()] == ["add_one"]
