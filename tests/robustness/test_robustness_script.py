"""`make robustness` end to end (shortened): the script that prints the robustness figures runs in CI,
over HTTP too, and reports nothing lost."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_robustness_script_reports_no_losses() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.robustness", "--clients", "16", "--duration", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    for tried, passed in re.findall(r"cases tried / passed:\s+(\d+) / (\d+)", out):
        assert tried == passed and int(tried) > 10
    assert re.findall(r"requests sent / lost[^:]*:\s+\d+ / 0\b", out)
    assert re.search(r"lost 0, garbled 0", out)
    assert "healthy afterwards:                True" in out
