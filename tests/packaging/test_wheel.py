"""The sdist and wheel: what they hold, and that the installed wheel works outside the checkout.

Builds offline from a copy of the working tree (``python -m build --no-isolation`` when the
``build`` package is installed, else setuptools' PEP 517 hooks called directly, sdist first and
the wheel from the unpacked sdist, as ``build`` does). The wheel is installed into a throwaway
venv (``venv --without-pip``, ``pip --python``) that then borrows the main venv's third-party
packages through a ``.pth`` line, written only after the install so that pip never sees the
checkout's editable install. The ``djl-handlers`` console script then runs from a directory
outside the repository, and the HF engine's default configuration runs there with the installed
package made read-only: every C kernel must build from the installed sources (``python -m
djl_handlers.kernels.prebuild``, as the image build runs it) and load, with no compiler run at the
first request. Marked ``slow`` (about a minute on two cores).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401

from djl_handlers.__about__ import __version__
from djl_handlers.kernels import build as kernel_build

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "djl_handlers"
CLI = REPO / PACKAGE / "cli.py"
DEFAULT_EXAMPLE = "hf-rolling-batch"
TIMEOUT = 300
# The kernels of the checkout: each <name>.c must reach the wheel, the sdist and the installed copy.
KERNELS = sorted(p.stem for p in (REPO / PACKAGE / "kernels").glob("*.c"))
QUANTIZED_ONLY = ("int8_gemm",)  # used under option.quantize=dynamic_int8, not by the default configuration


@dataclass(frozen=True)
class Artifacts:
    """The copied source tree and the two built distributions."""

    source: Path
    wheel: Path
    sdist: Path


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def _copy_tree(dest: Path) -> Path:
    """Every file git would see (tracked or untracked-but-not-ignored), copied to ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True, timeout=60).stdout
    for name in filter(None, listed.decode("utf-8").split("\0")):
        src = REPO / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _pep517(source: Path, out: Path) -> None:
    """sdist from ``source``, then the wheel from the unpacked sdist, with setuptools' hooks."""
    hook = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"
    name = _run([sys.executable, "-c", hook, "build_sdist", str(out)], cwd=source).stdout.strip().splitlines()[-1]
    unpacked = out.parent / "sdist-unpacked"
    with tarfile.open(out / name) as tar:
        tar.extractall(unpacked, filter="data")
    (root,) = unpacked.iterdir()
    _run([sys.executable, "-c", hook, "build_wheel", str(out)], cwd=root)


def _has_build_frontend() -> bool:
    """``build`` is installed (a leftover in-tree ``build/`` folder on ``sys.path`` is not it)."""
    try:
        return importlib.util.find_spec("build.__main__") is not None
    except ModuleNotFoundError:
        return False


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    base = tmp_path_factory.mktemp("packaging")
    source = _copy_tree(base / "src")
    out = base / "dist"
    out.mkdir()
    if _has_build_frontend():
        _run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(out), "."],
             cwd=source)
    else:
        _pep517(source, out)
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return Artifacts(source, wheel, sdist)


@pytest.fixture(scope="module")
def wheel_names(artifacts: Artifacts) -> set[str]:
    with zipfile.ZipFile(artifacts.wheel) as zf:
        return set(zf.namelist())


def _dist_info(artifacts: Artifacts, wheel_names: set[str], name: str) -> str:
    (path,) = [n for n in wheel_names if re.fullmatch(rf"{PACKAGE}-[^/]+\.dist-info/{name}", n)]
    with zipfile.ZipFile(artifacts.wheel) as zf:
        return zf.read(path).decode("utf-8")


def test_file_names_carry_the_version(artifacts: Artifacts) -> None:
    assert artifacts.wheel.name == f"{PACKAGE}-{__version__}-py3-none-any.whl"
    assert artifacts.sdist.name == f"{PACKAGE}-{__version__}.tar.gz"


def test_wheel_holds_every_module_and_py_typed(artifacts: Artifacts, wheel_names: set[str]) -> None:
    source = artifacts.source / PACKAGE
    expected = {p.relative_to(artifacts.source).as_posix() for p in source.rglob("*.py")
                if "__pycache__" not in p.parts}
    shipped = {n for n in wheel_names if n.endswith(".py")}
    assert expected - shipped == set(), "modules missing from the wheel (a subpackage without __init__.py?)"
    assert f"{PACKAGE}/py.typed" in wheel_names
    for handler in ("huggingface", "deepspeed", "tensorrt_llm", "vllm", "cli"):
        assert f"{PACKAGE}/{handler}.py" in wheel_names


def test_wheel_holds_nothing_else(wheel_names: set[str]) -> None:
    tops = {n.split("/", 1)[0] for n in wheel_names}
    assert tops == {PACKAGE, f"{PACKAGE}-{__version__}.dist-info"}, "only the package and its metadata"
    assert not any(n.startswith(("tests/", "djl_python/")) or "/tests/" in n for n in wheel_names)
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in wheel_names)


def test_wheel_metadata(artifacts: Artifacts, wheel_names: set[str]) -> None:
    metadata = _dist_info(artifacts, wheel_names, "METADATA")
    extras = set(re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M))
    assert {"hf", "deepspeed", "vllm", "trtllm", "server", "test"} <= extras
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
    assert requires and all("extra ==" in r for r in requires), "the core install pulls in no ML library"
    assert re.search(r"^Requires-Python: >=3\.10$", metadata, re.M)
    entry_points = _dist_info(artifacts, wheel_names, "entry_points.txt")
    assert re.search(r"^djl-handlers = djl_handlers\.cli:main$", entry_points, re.M)


def test_sdist_rebuilds_the_package(artifacts: Artifacts) -> None:
    with tarfile.open(artifacts.sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"setup.py", "pyproject.toml", "README.md", f"{PACKAGE}/__init__.py", f"{PACKAGE}/py.typed"} <= names
    assert not any(n.startswith("djl_python/") for n in names)


def test_wheel_and_sdist_ship_every_kernel_source(artifacts: Artifacts, wheel_names: set[str]) -> None:
    assert KERNELS, "the checkout has no kernels/*.c: this test would check nothing"
    expected = {f"{PACKAGE}/kernels/{name}.c" for name in KERNELS}
    assert expected - wheel_names == set(), "kernel sources missing from the wheel (setup.py package_data)"
    with tarfile.open(artifacts.sdist) as tar:
        sdist = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert expected - sdist == set(), "kernel sources missing from the sdist (MANIFEST.in)"
    with zipfile.ZipFile(artifacts.wheel) as zf:
        for name in sorted(expected):
            assert zf.read(name) == (REPO / name).read_bytes(), f"{name} in the wheel differs from the checkout's"


def test_wheel_ships_the_default_example(artifacts: Artifacts, wheel_names: set[str]) -> None:
    """``djl-handlers serve`` without MODEL_DIR needs ``djl_handlers/examples/hf-rolling-batch``."""
    shipped = f"{PACKAGE}/examples/{DEFAULT_EXAMPLE}/serving.properties"
    assert shipped in wheel_names
    with zipfile.ZipFile(artifacts.wheel) as zf:
        packaged = zf.read(shipped).decode("utf-8")
    repo_copy = REPO / "serving.properties.examples" / DEFAULT_EXAMPLE / "serving.properties"
    assert packaged == repo_copy.read_text(encoding="utf-8"), "the packaged example drifted from the repo's"


@dataclass(frozen=True)
class Venv:
    """A throwaway venv with the wheel installed and the main venv's site-packages borrowed."""

    python: Path
    script: Path
    site: Path
    workdir: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def venv(artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    base = tmp_path_factory.mktemp("venv")
    root = base / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=base)
    python = root / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
          "--disable-pip-version-check", "-q", str(artifacts.wheel)], cwd=base)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=base).stdout.strip())
    # Added after the install: pip must not see (let alone touch) the checkout's editable install.
    (site / "_borrow_main_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="2", PATH=f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    workdir = base / "elsewhere"
    workdir.mkdir()
    return Venv(python, root / "bin" / "djl-handlers", site, workdir, env)


def _in_venv(venv: Venv, *args: str, check: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), cwd=venv.workdir, env={**venv.env, **(env or {})}, capture_output=True,
                            text=True, timeout=TIMEOUT)
    if check:
        assert result.returncode == 0, f"{args} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def test_installed_package_is_the_wheel_and_imports_lightly(venv: Venv) -> None:
    code = (
        "import sys, djl_handlers, djl_handlers.huggingface, djl_handlers.vllm, djl_handlers.tensorrt_llm, "
        "djl_handlers.deepspeed, djl_handlers.config, djl_handlers.formatting; "
        "print(djl_handlers.__file__); "
        "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'tensorrt_llm') if m in sys.modules))"
    )
    where, heavy = _in_venv(venv, str(venv.python), "-c", code).stdout.strip().splitlines()
    assert Path(where).is_relative_to(venv.site), f"imported {where}, not the installed wheel"
    assert heavy == "[]", "importing the handlers must not import an ML library"
    assert not REPO.joinpath(".").samefile(venv.workdir)


def _cli_or_skip(venv: Venv) -> None:
    if not CLI.is_file():
        pytest.skip("djl_handlers/cli.py does not exist yet")
    assert venv.script.is_file(), "the wheel did not install the djl-handlers console script"


def test_cli_check_outside_the_repo(venv: Venv, tmp_path: Path) -> None:
    _cli_or_skip(venv)
    example = shutil.copytree(REPO / "serving.properties.examples" / "openai-tgi", tmp_path / "openai-tgi")
    result = _in_venv(venv, str(venv.script), "check", str(example))
    report = json.loads(result.stdout)
    assert report["servingConfig"]["engine"] == "huggingface"
    assert report["servingConfig"]["tgi_compat"] is True


def test_cli_check_rejects_a_bad_value(venv: Venv, tmp_path: Path) -> None:
    _cli_or_skip(venv)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "serving.properties").write_text(
        "engine=Python\noption.entryPoint=djl_handlers.huggingface\noption.model_id=/nowhere\noption.dtype=fp64\n",
        encoding="utf-8",
    )
    result = _in_venv(venv, str(venv.script), "check", str(bad), check=False)
    assert result.returncode == 1 and "dtype" in result.stderr, result.stderr


def test_cli_default_model_dir_exists_when_installed(venv: Venv) -> None:
    _cli_or_skip(venv)
    code = "from djl_handlers.cli import default_model_dir; print(default_model_dir())"
    path = Path(_in_venv(venv, str(venv.python), "-c", code).stdout.strip())
    assert path.is_relative_to(venv.site) and (path / "serving.properties").is_file()


def _tiny_model(folder: Path, tiny_dir: Path, extra: str = "") -> Path:  # noqa: F811
    """A model directory for the tiny model: rolling batch, otherwise the HF engine's defaults."""
    folder.mkdir()
    (folder / "serving.properties").write_text(
        "engine=Python\noption.entryPoint=djl_handlers.huggingface\n"
        f"option.model_id={tiny_dir}\noption.rolling_batch=scheduler\n{extra}",
        encoding="utf-8",
    )
    return folder


def test_cli_generate_on_a_tiny_model(venv: Venv, tmp_path: Path, tiny_dir: Path) -> None:  # noqa: F811
    _cli_or_skip(venv)
    model = _tiny_model(tmp_path / "tiny", tiny_dir, "option.dtype=fp32\n")
    body = json.dumps({"inputs": "Deep learning is", "parameters": {"max_new_tokens": 4, "details": True}})
    result = _in_venv(venv, str(venv.script), "generate", str(model), body)
    answer = json.loads(result.stdout)
    assert isinstance(answer["generated_text"], str)
    assert answer["details"]["generated_tokens"] == 4 and answer["details"]["finish_reason"] == "length"


def _set_writable(root: Path, writable: bool) -> None:
    bits = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IWUSR if writable else mode & ~bits)


def _package_files(venv: Venv) -> set[str]:
    """The installed package's files, bytecode caches aside (root ignores the read-only bits)."""
    package = venv.site / PACKAGE
    return {p.relative_to(package).as_posix() for p in package.rglob("*") if "__pycache__" not in p.parts}


@dataclass(frozen=True)
class KernelCache:
    """``python -m djl_handlers.kernels.prebuild`` run in the venv into a fresh cache folder."""

    folder: Path
    cc_log: Path  # one line per call of the compiler wrapper
    env: dict[str, str]
    prebuild: subprocess.CompletedProcess[str]
    package_before: set[str]

    def cc_calls(self) -> list[str]:
        return self.cc_log.read_text(encoding="utf-8").splitlines() if self.cc_log.is_file() else []


@pytest.fixture(scope="module")
def kernel_cache(venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelCache]:
    """The installed package made read-only, then the image build's warm-up step run in the venv,
    through a wrapper around the real compiler that logs its calls."""
    real = kernel_build.compiler()
    if real is None:
        pytest.skip("no C compiler (set CC or install gcc): the kernels cannot be built here")
    base = tmp_path_factory.mktemp("kernels")
    log, wrapper = base / "cc.log", base / "cc"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\nexec "{shutil.which(real)}" "$@"\n')
    wrapper.chmod(0o755)
    env = {"CC": str(wrapper), "DJL_HANDLERS_KERNEL_DIR": str(base / "cache")}
    package, before = venv.site / PACKAGE, _package_files(venv)
    _set_writable(package, False)
    try:
        result = _in_venv(venv, str(venv.python), "-m", "djl_handlers.kernels.prebuild", check=False, env=env)
        yield KernelCache(base / "cache", log, env, result, before)
    finally:
        _set_writable(package, True)


def test_prebuild_compiles_every_kernel_from_the_installed_sources(venv: Venv, kernel_cache: KernelCache) -> None:
    result = kernel_cache.prebuild
    assert result.returncode == 0, f"prebuild failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[0] == {"cache_dir": str(kernel_cache.folder)}
    records = {r["kernel"]: r for r in lines[1:]}
    assert sorted(records) == KERNELS
    for name, record in records.items():
        assert Path(record["source"]) == venv.site / PACKAGE / "kernels" / f"{name}.c", record
        assert Path(record["library"]).parent == kernel_cache.folder and Path(record["library"]).is_file(), record
    compiles = [c for c in kernel_cache.cc_calls() if " -c " in c]
    assert sorted({Path(c.split()[-1]).stem for c in compiles}) == KERNELS
    assert _package_files(venv) == kernel_cache.package_before, "the build wrote into site-packages"


# One request through `djl-handlers generate` in process, then every kernel the engine tried
_PROBE = """import importlib, json, sys
from djl_handlers import cli
from djl_handlers.kernels import build
rc = cli.main(["generate", sys.argv[1], sys.argv[2]])
kernels = {name: {"library": lib and str(lib), "error": build.error(name), "source": str(build.source(name)),
                  "module": importlib.import_module("djl_handlers.kernels." + name).__file__}
           for name, lib in build.loaded().items()}
json.dump({"rc": rc, "kernels": kernels}, open(sys.argv[3], "w"))
"""


def test_installed_hf_engine_loads_every_kernel_without_compiling(venv: Venv, kernel_cache: KernelCache,
                                                                  tmp_path: Path, tiny_dir: Path) -> None:  # noqa: F811
    """The HF engine's default configuration uses every kernel, each from the installed source and the cache."""
    model = _tiny_model(tmp_path / "tiny-defaults", tiny_dir)
    calls_before = len(kernel_cache.cc_calls())
    body = json.dumps({"inputs": "Deep learning is", "parameters": {"max_new_tokens": 4}})
    out = tmp_path / "kernels.json"
    _in_venv(venv, str(venv.python), "-c", _PROBE, str(model), body, str(out), env=kernel_cache.env)
    report = json.loads(out.read_text(encoding="utf-8"))
    kernels = report["kernels"]
    assert report["rc"] == 0
    assert sorted(kernels) == [k for k in KERNELS if k not in QUANTIZED_ONLY], \
        "the default configuration should use every kernel in djl_handlers/kernels but the int8 one"
    for name, kernel in kernels.items():
        assert kernel["error"] is None and kernel["library"], f"{name}: {kernel['error']}"
        for key in ("module", "source"):
            assert Path(kernel[key]).is_relative_to(venv.site), f"{name}'s {key} is {kernel[key]}, not the wheel's"
        assert Path(kernel["library"]).parent == kernel_cache.folder, kernel
    calls = kernel_cache.cc_calls()[calls_before:]
    assert not [c for c in calls if " -c " in c], "compiled at the first request despite the prebuilt cache"
    assert _package_files(venv) == kernel_cache.package_before, "the engine wrote into site-packages"


def test_served_benchmark_takes_the_installed_wheel(venv: Venv) -> None:
    """``python -m benchmarks served --python`` accepts the venv's wheel and refuses the checkout's copy."""
    import djl_handlers
    from benchmarks.served_engines import installed_package

    assert installed_package(str(venv.python)) == (venv.site / PACKAGE).resolve()
    if Path(djl_handlers.__file__).resolve().is_relative_to(REPO):  # this interpreter imports the checkout
        with pytest.raises(SystemExit, match="imports djl_handlers from the checkout"):
            installed_package(sys.executable)


def test_build_script_builds_the_wheel(artifacts: Artifacts, tmp_path: Path) -> None:
    """docker/build.sh's own wheel step (pip wheel, or build) on the copied tree, with a fake docker."""
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    fake.chmod(0o755)
    env = {**os.environ, "DOCKER": str(fake), "PYTHON": sys.executable, "PIP_NO_INDEX": "1"}
    result = _run(["bash", "docker/build.sh", "--tag", "t"], cwd=artifacts.source, env=env)
    wheels = list((artifacts.source / "dist").glob("djl_handlers-*.whl"))
    assert [w.name for w in wheels] == [artifacts.wheel.name], result.stdout
