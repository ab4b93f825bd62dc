"""Every documented ``docker/build.sh`` command runs, twice in a row, with ``--dry-run``.

The second run is the one that used to break: the first leaves setuptools' ``build/`` folder in the
tree, and a ``python -c "import build"`` probe then imported that folder. Each command builds the
real wheel (``pip wheel``) in a copy of the checkout; only ``docker build`` is left out. A failed
wheel build must leave the previous wheel in ``dist/``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted(REPO.glob("docs/*.md")), REPO / "docker" / "README.md",
        REPO / "serving.properties.examples" / "README.md"]
_SKIP = {".git", ".venv", ".venv-vllm", "build", "dist", "tests", "benchmarks", "docs", ".cache"}


def documented_build_commands() -> list[tuple[str, list[str]]]:
    """``(document, build.sh arguments)`` for every ``docker/build.sh`` line in a bash block."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words and words[0] == "docker/build.sh":
                    found.append((str(doc.relative_to(REPO)), words[1:]))
    return found


COMMANDS = documented_build_commands()


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout's sources (no venvs, no build outputs)."""
    root = tmp_path_factory.mktemp("checkout") / "repo"
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name in _SKIP:
            continue
        if entry.is_dir():
            shutil.copytree(entry, root / entry.name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist"))
        else:
            shutil.copy2(entry, root / entry.name)
    return root


def _build(root: Path, args: list[str], python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    if "--" in args:
        cut = args.index("--")
        args = [*args[:cut], "--dry-run", *args[cut:]]
    else:
        args = [*args, "--dry-run"]
    env = {**os.environ, "PYTHON": python, "DOCKER": "/bin/false"}
    return subprocess.run(["bash", "docker/build.sh", *args], cwd=root, capture_output=True, text=True,
                          timeout=600, env=env)


def test_the_docs_have_build_commands() -> None:
    docs = {doc for doc, _ in COMMANDS}
    assert {"docs/deployment.md", "docker/README.md", "serving.properties.examples/README.md"} <= docs


@pytest.mark.parametrize(("doc", "args"), COMMANDS, ids=[f"{d}:{' '.join(a)}" for d, a in COMMANDS])
def test_documented_build_command_runs_twice(tree: Path, doc: str, args: list[str]) -> None:
    for attempt in (1, 2):
        result = _build(tree, args)
        assert result.returncode == 0, f"{doc}, run {attempt}: {result.stderr[-2000:]}"
        wheels = sorted(p.name for p in (tree / "dist").glob("djl_handlers-*.whl"))
        assert len(wheels) == 1, (attempt, wheels)
        command = result.stdout.strip().splitlines()[-1]
        assert command.startswith("build.sh: ") and " build -f docker/Dockerfile " in command
        for flag, build_arg in (("--base-image", "BASE_IMAGE"), ("--extras", "EXTRAS"),
                                ("--entry-point", "ENTRY_POINT")):
            if flag in args:
                assert f"--build-arg {build_arg}={args[args.index(flag) + 1]} " in command + " "
    assert (tree / "build").is_dir(), "the in-tree build folder that broke the second run exists"


def test_a_failed_wheel_build_keeps_the_previous_wheel(tree: Path, tmp_path: Path) -> None:
    first = _build(tree, [])
    assert first.returncode == 0, first.stderr
    before = sorted((tree / "dist").glob("djl_handlers-*.whl"))
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'no wheel for you' >&2\nexit 1\n", encoding="utf-8")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    result = _build(tree, [], python=str(broken))
    assert result.returncode != 0
    assert sorted((tree / "dist").glob("djl_handlers-*.whl")) == before and len(before) == 1
    assert not list((tree / "dist").glob(".wheel-*")), "the staging folder is removed"
