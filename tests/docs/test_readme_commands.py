"""Execute the README's curl commands against real servers on the embedded model.

The README's example block starts servers on fixed ports (8080 default, 8081, 8082); the test
starts the same model directories on free ports, rewrites the ports in each command, runs it with
the shell, and checks the output's shape.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_server_harness import ROOT, ServerProcess  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")]

EXAMPLES = ROOT / "serving.properties.examples"
PORT_DIRS = {"8080": "hf-rolling-batch", "8081": "hf-dynamic-batch", "8082": "hf-dynamic-batch-streaming"}


def readme_curl_commands() -> list[str]:
    """Every ``curl`` command (with its continuation lines) in the README's bash blocks."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for command in block.replace("\\\n", " ").splitlines():
            if command.strip().startswith("curl "):
                commands.append(command.strip())
    return commands


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    logs = tmp_path_factory.mktemp("readme")
    started: dict[str, ServerProcess] = {}
    try:
        for port, name in PORT_DIRS.items():
            started[port] = ServerProcess(EXAMPLES / name, Path(logs / f"{name}.log"))
        yield started
    finally:
        for server in started.values():
            server.stop()


def test_readme_has_the_documented_commands() -> None:
    commands = readme_curl_commands()
    assert len(commands) >= 4
    assert {re.search(r"127\.0\.0\.1:(\d+)", c).group(1) for c in commands} <= set(PORT_DIRS)  # type: ignore[union-attr]


@pytest.mark.parametrize("index", range(len(readme_curl_commands())))
def test_readme_curl_command(servers: dict[str, ServerProcess], index: int) -> None:
    command = readme_curl_commands()[index]
    port = re.search(r"127\.0\.0\.1:(\d+)", command).group(1)  # type: ignore[union-attr]
    url = servers[port].url
    run = subprocess.run(command.replace(f"http://127.0.0.1:{port}", url), shell=True, capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    out = run.stdout.strip()
    if '"stream": true' in command or PORT_DIRS[port].endswith("streaming"):
        lines = [json.loads(line) for line in out.splitlines()]
        key = "outputs" if PORT_DIRS[port].endswith("streaming") else "token"
        assert lines and all(key in line for line in lines)
    else:
        body = json.loads(out)
        if isinstance(body, list):
            assert len(body) == 2 and all(item["generated_text"] for item in body)
        else:
            assert body["generated_text"] and body["details"]["generated_tokens"] == len(body["details"]["tokens"])
