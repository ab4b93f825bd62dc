"""The Python environment of a lent GPU machine, rehearsed on this one.

Such a machine has a Python with torch, transformers, accelerate and peft (and what they require)
and nothing else; ``scripts/gpu_check.sh --prepare`` carries the rest as the small pure-Python
wheels of ``requirements/gpu-check.txt``. This module computes that allow-list from the installed
distributions and uses it two ways:

- ``python -m benchmarks.gpu_env site DIR``: a folder of links to exactly those distributions
  (modules and ``.dist-info``) of this interpreter's site-packages, for a throwaway venv whose
  ``.pth`` names DIR: a device-like interpreter without downloading torch again;
- ``python -m benchmarks.gpu_env guarded MODULE [ARGS...]``: run ``MODULE`` (as ``python -m``) with
  every top-level import outside the standard library, the device's distributions, the wheelhouse
  and this repository refused, as a cheap check that the GPU check's imports are all carried.

On the machine, ``python -m benchmarks.gpu_env install WHEELS TARGET`` installs the carried wheels
that its Python lacks (or has older) into TARGET, a folder for PYTHONPATH, never into its
site-packages: with pip (``--no-index --no-deps --target``), or by unpacking them where pip is
missing (pure-Python wheels are zip files of importable modules).
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata as md
import re
import runpy
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any

#: What the GPU machine's Python holds besides its own requirements.
DEVICE_DISTRIBUTIONS = ("torch", "transformers", "accelerate", "peft")
REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "requirements" / "gpu-check.txt"
#: Top-level names of this repository (the working tree is copied to the machine).
REPO_MODULES = frozenset({"djl_handlers", "benchmarks", "tests", "conftest", "conftest_models", "integration"})


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: Iterable[str]) -> dict[str, md.Distribution]:
    """The installed distributions ``roots`` need: themselves and, transitively, their requirements
    without extras (markers evaluated for this interpreter); missing ones are left out."""
    from packaging.requirements import Requirement

    found: dict[str, md.Distribution] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if canonical(name) in found:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        found[canonical(name)] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def wheelhouse_names(path: Path = REQUIREMENTS) -> list[str]:
    """The distributions pinned in the GPU check's requirements file (``name==version`` lines)."""
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line.split("==", 1)[0].strip())
    return names


def entries(dist: md.Distribution) -> set[str]:
    """The first path components a distribution installs into site-packages (modules, packages,
    its ``.dist-info``), without ``__pycache__`` and scripts outside site-packages."""
    out = set()
    for file in dist.files or []:
        first = Path(str(file)).parts[0]
        if first in ("..", "__pycache__") or first.endswith(".data"):
            continue
        out.add(first)
    return out


def top_level_modules(dists: Iterable[md.Distribution]) -> set[str]:
    """Importable top-level names of ``dists`` (``foo`` for ``foo/`` and ``foo.py`` or ``foo.*.so``)."""
    names = set()
    for dist in dists:
        for first in entries(dist):
            if first.endswith((".dist-info", ".libs", ".pth")):
                continue
            names.add(first.split(".", 1)[0])
    return names


def allowed_modules(requirements: Path = REQUIREMENTS) -> frozenset[str]:
    """Every top-level module the GPU machine can import once the wheelhouse is installed."""
    names = top_level_modules(closure(DEVICE_DISTRIBUTIONS).values()) | set(sys.stdlib_module_names) | REPO_MODULES
    for name in wheelhouse_names(requirements):
        try:
            names |= top_level_modules([md.distribution(name)])
        except md.PackageNotFoundError:  # not for this Python (exceptiongroup, tomli): its module's name
            names.add(canonical(name).replace("-", "_"))
    return frozenset(names)


def make_site(target: Path) -> list[str]:
    """Link the device's distributions from this interpreter's site-packages into ``target``;
    return their names."""
    target.mkdir(parents=True, exist_ok=True)
    dists = closure(DEVICE_DISTRIBUTIONS)
    for dist in dists.values():
        base = Path(str(dist.locate_file("")))
        for first in entries(dist):
            link = target / first
            if not link.exists() and (base / first).exists():
                link.symlink_to(base / first)
    return sorted(dists)


def wheel_name_version(wheel: Path) -> tuple[str, str]:
    """``(distribution, version)`` from a wheel's file name (``name-version-py3-none-any.whl``)."""
    name, version = wheel.name.split("-")[:2]
    return name, version


def needed(wheels: Iterable[Path]) -> list[Path]:
    """The wheels whose distribution this interpreter lacks or has in an older version."""
    from packaging.version import Version

    out = []
    for wheel in sorted(wheels):
        name, version = wheel_name_version(wheel)
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            out.append(wheel)
            continue
        if Version(have) < Version(version):
            out.append(wheel)
    return out


def install(wheel_dir: Path, target: Path) -> list[str]:
    """Install :func:`needed` wheels of ``wheel_dir`` into ``target``; return their file names."""
    picked = needed(wheel_dir.glob("*.whl"))
    target.mkdir(parents=True, exist_ok=True)
    if not picked:
        return []
    has_pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
    if has_pip:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--disable-pip-version-check", "--target", str(target), *map(str, picked)], check=True)
    else:
        for wheel in picked:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(target)
    return [w.name for w in picked]


class ImportGuard(importlib.abc.MetaPathFinder):
    """Stands in front of the interpreter's finders and finds no top-level module outside
    ``allowed``, so that importing one fails and ``importlib.util.find_spec`` answers None, as on
    the machine."""

    def __init__(self, allowed: frozenset[str], finders: Sequence[Any]) -> None:
        self.allowed = allowed
        self.finders = list(finders)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        top = fullname.split(".", 1)[0]
        if path is None and top not in self.allowed and not top.startswith("_"):
            return None
        for finder in self.finders:
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def find_distributions(self, *args: Any, **kwargs: Any) -> Iterator[md.Distribution]:
        """The wrapped finders' distributions, for ``importlib.metadata`` (metadata is not filtered)."""
        for finder in self.finders:
            find = getattr(finder, "find_distributions", None)
            if find is not None:
                yield from find(*args, **kwargs)


def run_guarded(module: str, argv: Sequence[str]) -> None:
    """Run ``module`` as ``python -m`` would, behind an :class:`ImportGuard` of :func:`allowed_modules`."""
    sys.meta_path[:] = [ImportGuard(allowed_modules(), sys.meta_path)]
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "site":
        print("\n".join(make_site(Path(args[1]))))
        return 0
    if len(args) == 3 and args[0] == "install":
        names = install(Path(args[1]), Path(args[2]))
        print(f"gpu_check: installed {len(names)} carried wheels into {args[2]}: {' '.join(names) or 'none needed'}")
        return 0
    if len(args) >= 2 and args[0] == "guarded":
        run_guarded(args[1], args[2:])
        return 0
    print("usage: python -m benchmarks.gpu_env site DIR | install WHEELS TARGET | guarded MODULE [ARGS...]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
