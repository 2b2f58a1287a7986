"""Find the Variant(s) a user file (or a built-in name) defines, for the CLI and scripts.

TVMScript reports a mistake in a hook (``T.tanhh``, a wrong type) as a ``DiagnosticError`` whose text
is the rendered diagnostic: the message, ``--> file:line:column``, the line and a caret. TVM's own
exception hook prints only a note about ``TVM_BACKTRACE`` in its place; loading a file here turns it
into a :class:`VariantSourceError` carrying that text, and :func:`show_tvm_diagnostics` makes an
uncaught one print its text in scripts that define hooks themselves.
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the Variant's module imports TVM, which loading a file brings in when it needs it
    from attngen.ir import Variant


class VariantSourceError(ValueError):
    """A variant file that TVMScript could not parse; the message holds TVM's diagnostic (file, line,
    column, the line itself and a caret)."""


def diagnostic_text(err: BaseException) -> str:
    """TVM's rendered diagnostic of ``err``, trailing blanks dropped from each line."""
    return "\n".join(line.rstrip() for line in str(err).strip("\n").splitlines())


def is_tvm_diagnostic(exctype: type) -> bool:
    """Whether ``exctype`` is TVMScript's ``DiagnosticError`` (an error TVM raised means TVM is imported:
    the check imports nothing)."""
    errors = sys.modules.get("tvm.error")
    return errors is not None and issubclass(exctype, errors.DiagnosticError)


def show_tvm_diagnostics() -> None:
    """Make an uncaught TVMScript ``DiagnosticError`` print its diagnostic (TVM's exception hook prints
    only a note in its place). Safe to call more than once."""
    previous = sys.excepthook
    if getattr(previous, "_attngen_diagnostics", False):
        return

    def hook(exctype, value, tb):
        if is_tvm_diagnostic(exctype):
            print(diagnostic_text(value), file=sys.stderr)
        previous(exctype, value, tb)

    hook._attngen_diagnostics = True
    sys.excepthook = hook


def load_variants(source: str) -> list[Variant]:
    """Variants from a built-in name, or from a Python file's module-level Variant objects
    (a ``VARIANTS`` list wins; a ``make()`` factory is called when the file has no Variant)."""
    from attngen.ir import Variant

    path = Path(source)
    if path.suffix != ".py":
        from attngen.variants import BUILTINS, builtin

        if source in BUILTINS:
            return [builtin(source)]
        raise FileNotFoundError(f"{source!r} is neither a .py file nor a built-in variant "
                                f"(built-ins: {sorted(BUILTINS)})")
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {source}")
    name = "attngen_user_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(name, None)
        if is_tvm_diagnostic(type(e)):
            raise VariantSourceError(f"{source}: TVMScript could not parse a hook:\n{diagnostic_text(e)}") from None
        raise
    if isinstance(getattr(module, "VARIANTS", None), (list, tuple)):
        found = list(module.VARIANTS)
    else:  # each object once, though the module may bind it to several names
        found = list({id(v): v for v in vars(module).values() if isinstance(v, Variant)}.values())
    if not found and callable(getattr(module, "make", None)):
        found = [module.make()]
    if not found:
        raise ValueError(f"{source} defines no Variant: create one at module level, e.g. "
                         "variant = Variant('my_variant', logits_transform=...)")
    return found


def _check_distinct_names(source: str, variants: list) -> None:
    """Variants of one file are told apart by name (--variant NAME): two of one name are refused."""
    from attngen.ir.errors import repeated

    names = [v.name for v in variants]
    twice = repeated(names)
    if twice:
        raise ValueError(f"{source} defines {names.count(twice[0])} different variants named {twice[0]!r}; "
                         "give each variant a name of its own")


def pick_variant(source: str, name: str | None = None) -> Variant:
    variants = load_variants(source)
    _check_distinct_names(source, variants)
    if name is not None:
        for v in variants:
            if v.name == name:
                return v
        raise ValueError(f"{source} has no variant named {name!r}; it has {[v.name for v in variants]}")
    if len(variants) > 1:
        raise ValueError(f"{source} defines several variants {[v.name for v in variants]}; "
                         "choose one with --variant NAME")
    return variants[0]
