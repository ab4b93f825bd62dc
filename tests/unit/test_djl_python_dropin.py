"""``djl_handlers.io`` as a drop-in for DJL's ``djl_python``: DJL's own tests, run against our classes.

Each test builds, in its tmp folder, a package named ``djl_python`` (never shipped) whose ``Input``,
``Output``, ``PairList``, ``np_util`` and ``encode_decode`` are ours, plus ``test_model.py``,
``arg_parser.py``, ``service_loader.py`` and ``encode_decode.py`` (as ``encode_decode_jar``) copied
from DJL's jar (``tests/djl_serving/lib/python``, filled by ``tests/djl_serving/fetch.sh``, or env
``DJL_PYTHON_PATH``). It then runs, in a subprocess pytest, DJL's own ``test_input_output.py`` from
``../shared/third_party/djl-serving-0.34.0/python-tests`` (env ``DJL_PYTHON_TESTS`` overrides) and
the ``case_*.py`` files of ``tests/unit/dropin/``.

DJL's ``test_test_model.py`` is not run: it needs ``djl_python.huggingface`` and
``djl_python.tests.rolling_batch.fake_rolling_batch``, which neither the jar nor ../shared has;
``dropin/case_test_model.py`` is our equivalent (DJL's ``TestHandler`` driving our handler).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "dropin"
DJL_TESTS = Path("shared") / "third_party" / "djl-serving-0.34.0" / "python-tests"
JAR_FILES = ("test_model.py", "arg_parser.py", "service_loader.py")

# Our module behind each djl_python module name. The shim replaces itself in sys.modules, so
# ``mock.patch("djl_python.encode_decode.decode_csv")`` patches the function our code calls.
SHIMS = {
    "inputs": "djl_handlers.io.inputs",
    "outputs": "djl_handlers.io.outputs",
    "pair_list": "djl_handlers.io.pair_list",
    "np_util": "djl_handlers.io.ndlist",
    "encode_decode": "djl_handlers.io.encode_decode",
}


def _djl_tests_dir() -> Path | None:
    override = os.environ.get("DJL_PYTHON_TESTS")
    candidates = [Path(override)] if override else [parent / DJL_TESTS for parent in ROOT.parents]
    return next((c for c in candidates if (c / "test_input_output.py").is_file()), None)


def _jar_package() -> Path | None:
    for folder in (os.environ.get("DJL_PYTHON_PATH", ""), str(ROOT / "tests" / "djl_serving" / "lib" / "python")):
        package = Path(folder) / "djl_python" if folder else None
        if package is not None and all((package / name).is_file() for name in JAR_FILES):
            return package
    return None


def _build_package(dest: Path, jar: Path) -> Path:
    """``dest/djl_python``: shims over djl_handlers.io plus DJL's test_model and its helpers."""
    package = dest / "djl_python"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        '"""Test-only stand-in: djl_handlers.io under DJL\'s package name."""\n'
        "from djl_handlers.io import Input, Output, PairList\n\n"
        '__all__ = ["Input", "Output", "PairList"]\n'
    )
    for name, target in SHIMS.items():
        (package / f"{name}.py").write_text(
            f"import importlib\nimport sys\n\nsys.modules[__name__] = importlib.import_module({target!r})\n"
        )
    for name in JAR_FILES:
        shutil.copyfile(jar / name, package / name)
    shutil.copyfile(jar / "encode_decode.py", package / "encode_decode_jar.py")
    return dest


def _run_pytest(tmp_path: Path, files: list[Path], env_extra: dict[str, str] | None = None) -> ET.Element:
    """Copy ``files`` into a fresh folder, run pytest there with our djl_python first on the path."""
    jar = _jar_package()
    if jar is None:
        pytest.skip("DJL's djl_python (test_model.py) not found: run tests/djl_serving/fetch.sh or set DJL_PYTHON_PATH")
    packages = _build_package(tmp_path / "site", jar)
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "pytest.ini").write_text("[pytest]\npython_files = test_*.py case_*.py\n")
    for file in files:
        shutil.copyfile(file, tests / file.name)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(packages), str(ROOT)]), **(env_extra or {}))
    report = tmp_path / "report.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", "-rA"]
    result = subprocess.run(
        command + [f.name for f in files], cwd=tests, env=env, capture_output=True, text=True, timeout=900
    )
    assert report.is_file(), result.stdout[-4000:] + result.stderr[-4000:]
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    assert result.returncode == 0 and failed == 0, result.stdout[-6000:] + result.stderr[-2000:]
    return suite


def _names(suite: ET.Element, status: str) -> set[str]:
    """Test names in ``suite`` that passed (no child element) or were skipped."""
    out = set()
    for case in suite.iter("testcase"):
        children = {child.tag for child in case}
        if (status == "skipped") == ("skipped" in children) and not children & {"failure", "error"}:
            out.add(case.get("name", ""))
    return out


def test_djl_test_input_output_passes_against_djl_handlers_io(tmp_path: Path) -> None:
    djl_tests = _djl_tests_dir()
    if djl_tests is None:
        pytest.skip(f"DJL's python tests not found at ../{DJL_TESTS} (or env DJL_PYTHON_TESTS)")
    files = [djl_tests / "test_input_output.py", CASES / "case_identity.py", CASES / "case_jar_encode_decode.py"]
    suite = _run_pytest(tmp_path, files)
    passed = _names(suite, "passed")
    assert not _names(suite, "skipped")
    djl_names = {
        "test_empty_input", "test_string_input", "test_json_input", "test_numpy_input",
        "test_concurrent_batch", "test_output", "test_print_message", "test_finalize",
    }  # fmt: skip
    assert djl_names <= passed, sorted(djl_names - passed)
    assert {"test_djl_python_is_our_shim", "test_encode_default_branch_writes_an_ndlist"} <= passed


def test_djl_test_handler_drives_our_huggingface_handler(tmp_path: Path, tiny_dir: Path) -> None:  # noqa: F811
    env = {"TINY_MODEL_DIR": str(tiny_dir), "OMP_NUM_THREADS": "2"}  # the test machines are small
    suite = _run_pytest(tmp_path, [CASES / "case_test_model.py"], env)
    assert not _names(suite, "skipped")
    assert {
        "test_rolling_batch_with_serving_properties",
        "test_with_env_and_tgi_compat",
        "test_dynamic_batch_output_is_ours",
    } <= _names(suite, "passed")
