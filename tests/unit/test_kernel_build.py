"""Where kernels are found and cached (kernels/build.py) and the ahead-of-time build (kernels/prebuild.py)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from djl_handlers.kernels import KERNELS, build

PACKAGE_DIR = Path(build.__file__).parent
CACHE_VARS = ("DJL_HANDLERS_KERNEL_DIR", "DJL_HANDLERS_CACHE", "XDG_CACHE_HOME")


def test_the_kernel_list_names_every_c_file_and_its_module() -> None:
    assert sorted(KERNELS) == sorted(p.stem for p in PACKAGE_DIR.glob("*.c"))
    pytest.importorskip("torch")
    for name in KERNELS:
        module = importlib.import_module(f"djl_handlers.kernels.{name}")
        assert module.NAME == name and callable(module.available) and callable(module.unavailable_reason)
        assert build.source(name) == PACKAGE_DIR / f"{name}.c" and build.source(name).is_file()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"DJL_HANDLERS_KERNEL_DIR": "{tmp}/k", "DJL_HANDLERS_CACHE": "{tmp}/c", "XDG_CACHE_HOME": "{tmp}/x"},
         "{tmp}/k"),
        ({"DJL_HANDLERS_CACHE": "{tmp}/c", "XDG_CACHE_HOME": "{tmp}/x"}, "{tmp}/c/kernels"),
        ({"XDG_CACHE_HOME": "{tmp}/x"}, "{tmp}/x/djl_handlers/kernels"),
        ({}, "{tmp}/home/.cache/djl_handlers/kernels"),
    ],
)
def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str],
                              expected: str) -> None:
    for name in CACHE_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(tmp=tmp_path))
    assert build.cache_dir() == Path(expected.format(tmp=tmp_path))
    assert not build.cache_dir().is_relative_to(PACKAGE_DIR.parent), "never inside the (read-only) package"


def _prebuild(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in CACHE_VARS}
    environ.update(DJL_HANDLERS_KERNEL_DIR=str(tmp_path / "kernels"), **env)
    return subprocess.run([sys.executable, "-m", "djl_handlers.kernels.prebuild", *args], capture_output=True,
                          text=True, timeout=600, env=environ, cwd=tmp_path)


def _records(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return {r["kernel"]: r for r in lines[1:]}


def test_prebuild_builds_every_kernel_into_the_cache(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    if build.compiler() is None:
        pytest.skip("no C compiler here")
    result = _prebuild(tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[0]) == {"cache_dir": str(tmp_path / "kernels")}
    records = _records(result)
    assert sorted(records) == sorted(KERNELS)
    libraries = {Path(r["library"]) for r in records.values()}
    assert libraries == set((tmp_path / "kernels").glob("*.so")) and len(libraries) == len(KERNELS)


def test_prebuild_fails_when_a_kernel_cannot_be_built(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    broken = tmp_path / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'broken-cc: no luck' >&2\nexit 1\n")
    broken.chmod(0o755)
    result = _prebuild(tmp_path, CC=str(broken))
    assert result.returncode == 1 and "prebuild: cannot build " + ", ".join(KERNELS) in result.stderr
    assert all("broken-cc: no luck" in r["error"] and "library" not in r for r in _records(result).values())
    allowed = _prebuild(tmp_path, "--allow-unavailable", CC=str(broken))
    assert allowed.returncode == 0 and sorted(_records(allowed)) == sorted(KERNELS)
