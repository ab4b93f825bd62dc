"""StopSequenceMatcher: stop strings found across piece boundaries, earliest one first."""

from __future__ import annotations

from djl_handlers.scheduling.stopping import StopSequenceMatcher


def test_match_spanning_several_short_pieces() -> None:
    matcher = StopSequenceMatcher(["brown"])
    pieces = list("The quick br") + ["ow", "n fox"]
    found = [matcher.push(p) for p in pieces]
    assert all(m is None for m in found[:-1])
    last = found[-1]
    assert last is not None and last.sequence == "brown" and "n fox"[: last.end] == "n"


def test_earliest_of_several_sequences_wins() -> None:
    matcher = StopSequenceMatcher(["lazy", "fox", "jumps"])
    assert matcher.push("The quick brown f") is None
    match = matcher.push("ox jumps over the lazy dog")
    assert match is not None and match.sequence == "fox" and match.end == 2


def test_no_sequences_never_matches() -> None:
    matcher = StopSequenceMatcher([])
    assert not matcher and matcher.push("anything") is None
