"""Documents cite only what ships: every relative link and every cited file path exists in the checkout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("*/README.md"),
               *REPO.glob("serving.properties.examples/*/README.md")])
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# `path/to/file.ext` in backticks naming a file by a project-relative path.
CITED = re.compile(r"`((?:reference|docs|djl_handlers|tests|scripts|docker|benchmarks|serving\.properties\.examples)"
                   r"/[\w./-]+\.(?:md|py|sh|json|txt|toml|properties))`")


def _relative_links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_and_cited_files_exist(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    missing = [t for t in _relative_links(text) if not (doc.parent / t).exists()]
    missing += [c for c in CITED.findall(text) if not (REPO / c).exists() and "*" not in c]
    assert not missing, f"{doc.relative_to(REPO)} cites what does not ship: {missing}"


def test_the_checker_sees_a_missing_reference() -> None:
    text = "see `reference/models_and_engines.md` and [x](../../shared/reference/perf_anchors.md)"
    assert CITED.findall(text) == ["reference/models_and_engines.md"]
    assert _relative_links(text) == ["../../shared/reference/perf_anchors.md"]


def test_server_md_lists_every_route() -> None:
    """Each ``Route("...")`` of the local server is a row of docs/server.md's route table."""
    app = (REPO / "djl_handlers" / "server" / "app.py").read_text(encoding="utf-8")
    routes = set(re.findall(r'Route\("([^"]+)"', app))
    assert {"/v1/chat/completions", "/generate", "/"} <= routes
    table = (REPO / "docs" / "server.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(?:GET |POST |GET/POST )?([^` ]+)", table, flags=re.M))
    documented = {r.split("[")[0] for r in rows}
    missing = [r for r in routes if r not in documented and r.replace("/{version}", "") not in documented]
    assert not missing, f"docs/server.md's route table lacks {missing}"
