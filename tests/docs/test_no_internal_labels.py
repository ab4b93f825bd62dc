"""Documents speak to users: no internal issue numbers, session or run labels, or a machine's absolute
paths; raw benchmark results stay out of docs/ (they go to the git-ignored benchmarks/results/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("*/README.md"),
               *REPO.glob("serving.properties.examples/*/README.md")])

_ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
#: (what it is, pattern); matched case-insensitively against each line.
LABELS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        ("internal issue number", r"\bissues?\s*#?\d+"),
        ("session label",
         rf"\b{_ORDINAL}\s+session\b|\bsession\s+#?\d+\b|\b(?:this|previous|next|earlier|later)\s+session\b"),
        ("run label", r"\brun\s+#?\d+\b|\bs\d{1,2}\b"),
        ("machine path", r"(?<![\w.])/(?:work|root|home)/"),
    )
)
#: Words a pattern would take for a label but that name something else: AWS's S3.
ALLOWED = re.compile(r"\bs3\b", re.IGNORECASE)


def labels_in(text: str) -> list[str]:
    """``"line N: <kind>: <match>"`` for every internal label in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for kind, pattern in LABELS:
            found += [f"line {number}: {kind}: {m.group(0)!r}" for m in pattern.finditer(line)
                      if not ALLOWED.fullmatch(m.group(0))]
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_document_carries_no_internal_label(doc: Path) -> None:
    found = labels_in(doc.read_text(encoding="utf-8"))
    assert not found, f"{doc.relative_to(REPO)} carries internal labels (history belongs in git): {found}"


def test_the_checker_sees_each_kind_of_label() -> None:
    text = ("fixed for issue 15\nmeasured in the ninth session\nsee session 8\nraw: benchmarks-served-s7.json\n"
            "run 3 of 4\nin /work/main/.venv\nunder /root/.cache\nfrom /home/user\n")
    kinds = [hit.split(": ")[1] for hit in labels_in(text)]
    assert kinds == ["internal issue number", "session label", "session label", "run label", "run label",
                     "machine path", "machine path", "machine path"]


def test_the_checker_lets_ordinary_words_through() -> None:
    text = ("DJL 0.34's `Session` keeps the request id; stateful sessions; pytest session fixtures\n"
            "model_data=\"s3://bucket/model.tar.gz\"; run the benchmark; 4 rounds; issues are welcome\n"
            "`.venv/bin/python` and `tests/djl_serving/lib/`; /opt/ml/model\n")
    assert labels_in(text) == []


def test_docs_hold_no_raw_benchmark_results() -> None:
    raw = [p.name for p in (REPO / "docs").iterdir()
           if p.suffix in {".json", ".jsonl"} or re.match(r"(benchmarks|gpu-check)-", p.name)]
    assert not raw, f"raw results belong in benchmarks/results/ (git-ignored), not docs/: {raw}"


def test_benchmark_results_folder_is_git_ignored() -> None:
    from benchmarks.common import RESULTS

    ignored = {line.strip().rstrip("/") for line in (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()}
    assert RESULTS.relative_to(REPO).as_posix() in ignored
