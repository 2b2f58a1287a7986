"""C++ text of constexpr tables: how a template record writes its section of ``attngen_tiles.h``."""
from __future__ import annotations


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(int(v))


def cxx_table(name: str, comment: str, fields: tuple[tuple[str, str], ...], rows: list[tuple]) -> str:
    """``struct <name>Row { ... };`` and ``inline constexpr <name>Row k<name>[] = {...};``; ``fields`` are
    (C++ type, field name) pairs, ``rows`` tuples of values in the same order."""
    assert rows and all(len(r) == len(fields) for r in rows), name
    lines = [f"// {line}" for line in comment.splitlines()]
    lines.append(f"struct {name}Row {{")
    lines += [f"  {ctype} {field};" for ctype, field in fields]
    lines.append("};")
    lines.append(f"// {', '.join(field for _, field in fields)}")
    lines.append(f"inline constexpr {name}Row k{name}[] = {{")
    lines += ["    {" + ", ".join(_value(v) for v in row) + "}," for row in rows]
    lines.append("};")
    return "\n".join(lines) + "\n"


def cxx_constant(ctype: str, name: str, value, comment: str) -> str:
    return f"// {comment}\ninline constexpr {ctype} {name} = {_value(value)};\n"
