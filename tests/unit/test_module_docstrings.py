"""Every module of ``djl_handlers`` opens with a docstring whose first line says what the module holds."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "djl_handlers"
MAX_FIRST_LINE = 120


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def docstring_problem(name: str, source: str) -> str | None:
    """Why ``source``'s opening docstring does not say what module ``name`` holds, or None when it does."""
    docstring = ast.get_docstring(ast.parse(source), clean=True)
    if not docstring:
        return "no module docstring"
    first = docstring.splitlines()[0].strip()
    if not first:
        return "the first line is empty"
    if len(first) > MAX_FIRST_LINE:
        return f"the first line has {len(first)} characters (at most {MAX_FIRST_LINE})"
    words = first.replace(name, " ").replace(name.rsplit(".", 1)[-1], " ").split()
    if len(words) < 3:
        return f"the first line {first!r} names the module without saying what it holds"
    return None


def test_the_checker_rejects_what_it_should() -> None:
    assert docstring_problem("djl_handlers.x", "import os\n") == "no module docstring"
    assert docstring_problem("djl_handlers.x", '"""\n\nText after an empty line."""\n') is None  # clean=True strips
    long = "word " * 30
    assert docstring_problem("djl_handlers.x", f'"""{long}"""\n') == (
        f"the first line has {len(long.strip())} characters (at most {MAX_FIRST_LINE})")
    assert "names the module" in docstring_problem("djl_handlers.scheduling", '"""djl_handlers.scheduling"""\n')
    assert "names the module" in docstring_problem("djl_handlers.io.wire", '"""The wire."""\n')
    assert docstring_problem("djl_handlers.io.wire", '"""The binary frame codec of DJL\'s protocol."""\n') is None


def test_every_module_says_what_it_holds() -> None:
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 100 and PACKAGE / "engines" / "hf" / "engine.py" in paths  # the package's own files
    problems = {}
    for path in paths:
        name = _module_name(path)
        problem = docstring_problem(name, path.read_text(encoding="utf-8"))
        if problem:
            problems[name] = problem
    assert problems == {}
