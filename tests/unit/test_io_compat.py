"""``compat``: our classes when djl_python is absent, djl_python's when it is importable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from djl_handlers.io import Input, Output, compat

ROOT = Path(__file__).resolve().parents[2]


def _drop_djl_modules() -> None:
    for name in [m for m in sys.modules if m == "djl_python" or m.startswith("djl_python.")]:
        del sys.modules[name]


@pytest.fixture
def no_djl_python(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make ``import djl_python`` fail for the duration of a test."""
    saved = {m: sys.modules[m] for m in list(sys.modules) if m.split(".")[0] == "djl_python"}
    _drop_djl_modules()
    monkeypatch.setitem(sys.modules, "djl_python", None)
    yield
    monkeypatch.delitem(sys.modules, "djl_python", raising=False)
    sys.modules.update(saved)


@pytest.fixture
def fake_djl_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A stand-in ``djl_python`` package on ``sys.path`` with its own Input/Output classes."""
    package = tmp_path / "djl_python"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "inputs.py").write_text("class Input:\n    pass\n")
    (package / "outputs.py").write_text(
        textwrap.dedent(
            """
            class Output:
                def __init__(self, code=200, message="OK"):
                    self.code = code
            """
        )
    )
    saved = {m: sys.modules[m] for m in list(sys.modules) if m.split(".")[0] == "djl_python"}
    _drop_djl_modules()
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    _drop_djl_modules()
    sys.modules.update(saved)


def test_our_classes_without_djl_python(no_djl_python: None) -> None:
    assert compat.djl_python_classes() is None
    assert compat.io_classes() == (Input, Output)
    assert type(compat.new_output()) is Output
    assert type(compat.new_output(Input())) is Output


def test_djl_python_classes_when_importable(fake_djl_python: Path) -> None:
    input_cls, output_cls = compat.io_classes()
    assert (input_cls.__module__, input_cls.__name__) == ("djl_python.inputs", "Input")
    assert (output_cls.__module__, output_cls.__name__) == ("djl_python.outputs", "Output")
    djl_input = input_cls()
    assert compat.is_djl_python_object(djl_input) and not compat.is_djl_python_object(Input())
    assert type(compat.new_output(djl_input)) is output_cls
    assert type(compat.new_output()) is output_cls
    # an Input of our own family still gets our Output even though djl_python is importable
    assert type(compat.new_output(Input())) is Output


def test_importing_io_does_not_import_djl_python(fake_djl_python: Path) -> None:
    code = (
        "import sys, djl_handlers.io, djl_handlers.io.compat, djl_handlers.io.wire;"
        "print(sorted(m for m in sys.modules if m.startswith('djl_python')))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake_djl_python), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_failed_lookup_is_retried_once_djl_python_becomes_importable(
        no_djl_python: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert compat.djl_python_classes() is None
    assert compat.djl_python_classes() is None  # answered from the remembered miss
    monkeypatch.delitem(sys.modules, "djl_python")
    package = tmp_path / "djl_python"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "inputs.py").write_text("class Input:\n    pass\n")
    (package / "outputs.py").write_text("class Output:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = compat.djl_python_classes()
    assert found is not None and found[0].__module__ == "djl_python.inputs"
    _drop_djl_modules()
