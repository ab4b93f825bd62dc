"""The robustness corpus as HTTP requests for two front ends, and what differs between their answers.

No tests here (``tests/integration/test_corpus_on_djl.py`` runs it against DJL Serving's real
front end and ``djl-handlers serve``). A :class:`Probe` is one request: every HTTP-able corpus case
of ``corpus.py`` (on ``/invocations`` and on ``/predictions/{model}``) and every input of
``fuzz_inputs.json`` (what the schema fuzzer generated or found). :func:`send_all` sends probes to
one server and reduces each answer to a :class:`Reply` (status, media type, error body shape);
:func:`differences` lists where two servers' replies differ; :func:`read_table` reads the table of
documented differences from ``docs/deviations.md``, the one source of truth, and
:meth:`Deviation.covers` matches a difference against a row.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Optional

import httpx

from tests.robustness.corpus import CORPUS, DYNAMIC, ROLLING, Case

ROOT = Path(__file__).resolve().parents[2]
FUZZ_INPUTS = Path(__file__).resolve().parent / "fuzz_inputs.json"
DEVIATIONS = ROOT / "docs" / "deviations.md"
TABLE_HEADING = "## DJL Serving's front end and ours: the robustness corpus"
ROUTES = ("/invocations", "/predictions/{model}")
MODES = ("rolling", "dynamic", "async")  # async mode runs requests as the rolling batch does
ALL = "all"


@dataclass(frozen=True)
class Probe:
    """One HTTP request; ``name`` is the corpus case's (``predictions:`` prefixed on that route)."""

    name: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def url(self, base: str, model: str) -> str:
        """The full URL on the server at ``base`` serving ``model``."""
        return base + self.path.replace("{model}", model)


@dataclass(frozen=True)
class Reply:
    """What a client saw: status (None: no answer), media type, and the error body's shape."""

    status: Optional[int]
    media: str = ""
    shape: str = ""
    text: Optional[str] = None  # the generated text of an LMI answer (None: not one)

    @property
    def is_error(self) -> bool:
        """A 4xx/5xx, or a 200 body that is an error (dynamic batching answers errors with 200)."""
        return self.status is None or self.status >= 400 or self.shape.startswith("{code, ")

    @property
    def label(self) -> str:
        """The status as compared: ``200 (error body)`` for a dynamic batch's refusal."""
        if self.status is not None and self.status < 400 and self.is_error:
            return f"{self.status} (error body)"
        return str(self.status)


@dataclass(frozen=True)
class Difference:
    """One probe answered differently: ``what`` is ``status`` or ``error body``."""

    probe: str
    what: str
    djl: str
    ours: str

    def __str__(self) -> str:
        return f"{self.probe}: {self.what} DJL {self.djl!r}, ours {self.ours!r}"


def _headers(case: Case) -> tuple[tuple[str, str], ...]:
    headers = list(case.headers)
    if case.content_type is not None:
        headers.append(("Content-Type", case.content_type))
    if case.api is not None:
        headers.append(("X-Djl-Handlers-Api", case.api))
    return tuple(headers)


def corpus_probes(mode: str) -> list[Probe]:
    """The corpus cases a server in ``mode`` can take over HTTP, on both routes DJL serves."""
    kind = DYNAMIC if mode == "dynamic" else ROLLING
    chosen = [c for c in CORPUS if c.http and kind in c.modes and c.engine == "huggingface"]
    return [Probe(c.name if route == ROUTES[0] else f"predictions:{c.name}", route, _headers(c), c.body)
            for route in ROUTES for c in chosen]


def fuzz_probes(path: Path = FUZZ_INPUTS) -> list[Probe]:
    """The schema fuzzer's inputs, as recorded in ``fuzz_inputs.json``."""
    entries = json.loads(path.read_text(encoding="utf-8"))["inputs"]
    probes = []
    for entry in entries:
        body = (base64.b64decode(entry["body_base64"]) if "body_base64" in entry
                else entry["body"].encode("utf-8"))
        probes.append(Probe(f"fuzz:{entry['name']}", entry["path"], tuple(entry["headers"].items()), body))
    return probes


def all_probes(mode: str) -> list[Probe]:
    """Corpus and fuzzer probes for a server in ``mode``; names are unique."""
    probes = corpus_probes(mode) + fuzz_probes()
    names = [p.name for p in probes]
    if len(set(names)) != len(names):
        raise AssertionError("probe names are not unique")
    return probes


def shape_of(body: bytes) -> str:
    """``{key, key}`` (JSON object, keys in order), ``[list]``, ``json``, ``text`` or ``empty``."""
    if not body:
        return "empty"
    try:
        value = json.loads(body)
    except ValueError:
        return "text"
    if isinstance(value, dict):
        return "{" + ", ".join(value) + "}"
    return "[list]" if isinstance(value, list) else "json"


def generated_text(body: bytes) -> Optional[str]:
    """The generated text of an LMI answer: ``generated_text`` of a JSON object, of each object of a
    list (joined by ``|``), or of the last JSON line; None for anything else."""
    try:
        lines = [json.loads(body)]  # one JSON value, pretty-printed or not
    except ValueError:
        try:
            lines = [json.loads(line) for line in body.decode("utf-8").splitlines() if line.strip()]
        except ValueError:
            return None
    last = lines[-1] if lines else None
    if isinstance(last, list) and len(lines) == 1:
        texts = [item.get("generated_text") if isinstance(item, dict) else None for item in last]
        return "|".join(texts) if texts and all(isinstance(t, str) for t in texts) else None
    text = last.get("generated_text") if isinstance(last, dict) else None
    return text if isinstance(text, str) else None


def reply_of(response: httpx.Response) -> Reply:
    """A response reduced to what is compared."""
    media = response.headers.get("content-type", "").split(";")[0].strip().lower()
    return Reply(response.status_code, media, shape_of(response.content), generated_text(response.content))


def send_all(base: str, model: str, probes: Sequence[Probe], timeout: float = 30.0,
             resent: Optional[list[str]] = None) -> dict[str, Reply]:
    """Send every probe, one after the other, to the server at ``base``; a transport error is a
    status of None. With a ``resent`` list, a probe that timed out is sent once more and named there."""
    replies: dict[str, Reply] = {}
    with httpx.Client(timeout=timeout) as client:
        for probe in probes:
            for attempt in range(2):
                try:
                    response = client.post(probe.url(base, model), content=probe.body, headers=list(probe.headers))
                except httpx.TimeoutException as exc:
                    replies[probe.name] = Reply(None, shape=type(exc).__name__)
                    if resent is None or attempt:
                        break
                    resent.append(probe.name)
                    continue
                except httpx.HTTPError as exc:
                    replies[probe.name] = Reply(None, shape=type(exc).__name__)
                    break
                replies[probe.name] = reply_of(response)
                break
    return replies


def _error_form(reply: Reply) -> str:
    return f"{reply.media} {reply.shape}".strip()


def differences(djl: dict[str, Reply], ours: dict[str, Reply]) -> list[Difference]:
    """Where the statuses differ, both are errors in a different body shape or media type, or both
    answered an LMI text and the texts differ (the fake engine is deterministic)."""
    found = []
    for name, theirs in djl.items():
        mine = ours[name]
        if theirs.label != mine.label:
            found.append(Difference(name, "status", theirs.label, mine.label))
        elif theirs.is_error and mine.is_error and _error_form(theirs) != _error_form(mine):
            found.append(Difference(name, "error body", _error_form(theirs), _error_form(mine)))
        elif theirs.text is not None and mine.text is not None and theirs.text != mine.text:
            found.append(Difference(name, "text", theirs.text[:60], mine.text[:60]))
    return found


@dataclass(frozen=True)
class Deviation:
    """One row of the table: which probes, modes and releases, and the two answers."""

    cases: tuple[str, ...]
    modes: tuple[str, ...]
    releases: tuple[str, ...]
    what: str
    djl: str
    ours: str

    def applies(self, release: str, mode: str) -> bool:
        """The row is about a server pair of ``release`` in ``mode``."""
        return (ALL in self.modes or mode in self.modes) and (ALL in self.releases or release in self.releases)

    def covers(self, diff: Difference, release: str, mode: str) -> bool:
        """The row documents ``diff`` seen on ``release`` in ``mode``."""
        return (self.applies(release, mode) and diff.what == self.what and diff.djl == self.djl
                and diff.ours == self.ours and any(fnmatchcase(diff.probe, p) for p in self.cases))


_CELL = re.compile(r"`([^`]*)`")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _ticked(cell: str) -> tuple[str, ...]:
    return tuple(_CELL.findall(cell)) or tuple(p.strip() for p in cell.split(",") if p.strip())


def read_table(path: Path = DEVIATIONS) -> list[Deviation]:
    """The rows of the table under :data:`TABLE_HEADING` (columns: cases, modes, releases, what,
    DJL, ours, why; backticks around patterns and answers)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = lines.index(TABLE_HEADING)
    rows: list[Deviation] = []
    table = False
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if table:
                break
            continue
        table = True
        cells = _cells(line)
        if cells[0] == "cases" or set(cells[0]) <= {"-", ":"}:
            continue
        cases, modes, releases, what, djl, ours = cells[:6]
        rows.append(Deviation(_ticked(cases), _ticked(modes), _ticked(releases), what,
                              _CELL.findall(djl)[0], _CELL.findall(ours)[0]))
    return rows


def undocumented(found: Iterable[Difference], rows: Sequence[Deviation], release: str, mode: str) -> list[str]:
    """The differences no row documents."""
    return [str(d) for d in found if not any(r.covers(d, release, mode) for r in rows)]


def stale(found: Sequence[Difference], rows: Sequence[Deviation], release: str, mode: str) -> list[Deviation]:
    """The rows about this pair that no difference matches any more."""
    return [r for r in rows if r.applies(release, mode) and not any(r.covers(d, release, mode) for d in found)]


def describe(probes: Sequence[Probe], djl: dict[str, Reply], ours: dict[str, Reply]) -> dict[str, Any]:
    """Counts of a run: probes, statuses on each side."""
    def count(replies: dict[str, Reply]) -> dict[str, int]:
        out: dict[str, int] = {}
        for reply in replies.values():
            out[str(reply.status)] = out.get(str(reply.status), 0) + 1
        return out

    return {"probes": len(probes), "djl": count(djl), "ours": count(ours)}
