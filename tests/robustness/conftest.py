"""Make ``tests.robustness`` importable however pytest is started (the corpus is shared with
``benchmarks/robustness.py``, which imports it by that name)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
