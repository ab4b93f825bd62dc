"""Documents cite only what ships: every relative link and every cited file path exists in the checkout,
and every ``#anchor`` of a link to a Markdown file names one of its headings."""

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


ANCHORED = re.compile(r"\]\(([^)\s#]*)#([^)\s]+)\)")
HEADING = re.compile(r"#{1,6} (.+)")


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of ``text``: lower case, punctuation dropped, spaces as
    hyphens, ``-1``, ``-2`` ... for repeats; headings inside code fences do not count."""
    anchors: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := HEADING.match(line)):
            base = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            anchor, n = base, 0
            while anchor in anchors:
                n += 1
                anchor = f"{base}-{n}"
            anchors.add(anchor)
    return anchors


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_link_anchors_name_a_heading(doc: Path) -> None:
    broken = []
    for target, anchor in ANCHORED.findall(doc.read_text(encoding="utf-8")):
        path = doc.parent / target if target else doc
        if re.match(r"[a-z]+:", target) or path.suffix != ".md" or not path.exists():
            continue  # external, not Markdown, or reported by the test above
        if anchor not in heading_anchors(path.read_text(encoding="utf-8")):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{doc.relative_to(REPO)} links to headings that do not exist: {broken}"


def test_heading_anchors_follow_githubs_rules() -> None:
    text = "# Benchmarks\n## GPU check (H200)\n## Front end vs DJL Serving's ModelServer\n## Memory\n## Memory\n" \
           "```\n# not a heading\n```\n"
    assert heading_anchors(text) == {"benchmarks", "gpu-check-h200", "front-end-vs-djl-servings-modelserver",
                                     "memory", "memory-1"}


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
