"""Beam-search requests (``num_beams`` > 1) as rows of the HF engine's running batch.

A beam request is ``num_beams`` rows of the one running batch, beside greedy and sampling rows of
other requests. Its prompt is prefilled once, as one row; right after that forward the row is
forked into ``num_beams`` rows whose KV starts as copies of the prefilled one (``fork_beams``, the
way ``n`` samples fork). Every step, after the shared forward, :func:`advance_beams` takes the
request's rows' logits, applies the request's processors to their log-probabilities (repetition
penalty, ``min_new_tokens``) and lets :class:`~djl_handlers.engines.hf.beams.BeamSearch` choose the
next beams. A new beam that is its parent's first child keeps the parent's row (its slot number
moves); a further child of one parent takes the row of a beam left without a child and a copy of the
parent's KV row (one index copy per layer for all beam requests of the step). Other rows are untouched.

A beam request reports only settled tokens (``BeamSearch.settled``, the prefix no later step can
change) as they grow, and when the search ends the rest of its best hypothesis, the last token with
``finish_reason`` (``eos_token`` when it ends with one, else ``length``); its rows then leave the
batch. Each token's ``log_prob`` is the model's (before processors), as for every other row.

With ``n`` (or ``best_of``) > 1, up to ``num_beams``, the request's sample ids each report one
hypothesis, the best under the request's own id: the settled tokens under every id (every hypothesis
starts with them), then each the rest of its own.

What a beam request may not combine (a 400 from :func:`check_beams`): sampling (``do_sample``: vLLM's
beam search is greedy only), more ``n``/``best_of`` than beams, ``top_n_tokens``, structured
output, more beams than ``option.max_rolling_batch_size`` rows, speculative decoding and decode
graphs (both keep per-row state that a beam's KV copy would bypass).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from djl_handlers.engines.base import StepOutput
from djl_handlers.engines.hf.beams import BeamSearch, beam_outputs
from djl_handlers.engines.hf.rows import Row
from djl_handlers.errors import InvalidParameter
from djl_handlers.params.samples import sample_count
from djl_handlers.params.translate import is_sampling

__all__ = ["PromptLps", "advance_beams", "beam_search_for", "check_beams", "fork_beams", "release_beam"]

PromptLps = list[list[float | None] | None] | None


def check_beams(params: Any, max_batch_size: int, *, speculation: bool = False, graphs: bool = False) -> None:
    """400 (naming the field) unless ``params``' beam search can run on this engine (module docstring)."""
    beams = int(params.num_beams)
    if beams <= 1:
        return
    refusals = (
        (is_sampling(params), "do_sample",
         "beam search is greedy here (as in vLLM); set do_sample=false (or temperature 0)"),
        (sample_count(params) > beams, "best_of" if params.best_of is not None else "n",
         f"beam search returns at most num_beams ({beams}) sequences"),
        (params.top_n_tokens > 0, "top_n_tokens", "top tokens are not reported for beams"),
        (params.structured_output is not None, "num_beams", "structured output cannot be combined with beams"),
        (params.presence_penalty != 0.0, "presence_penalty", "the beams' scores take the repetition penalty only"),
        (params.frequency_penalty != 0.0, "frequency_penalty", "the beams' scores take the repetition penalty only"),
        (bool(params.bad_sequences), "bad_sequences", "bad words are not applied to beams"),
        (speculation, "num_beams", "it cannot be combined with option.speculative_config"),
        (graphs, "num_beams", "it cannot be combined with option.decode_graphs"),
    )
    for refused, field, why in refusals:
        if refused:
            raise InvalidParameter(f"parameters.{field} cannot be used with num_beams={beams}: {why}", field=field)
    if beams > max_batch_size:
        raise InvalidParameter(
            f"parameters.num_beams is {beams} but every beam is one row of the running batch, which has "
            f"{max_batch_size} (option.max_rolling_batch_size): ask for at most {max_batch_size}",
            field="num_beams",
        )


def beam_search_for(
    settings: Mapping[str, Any], prompt_len: int, max_model_len: int, eos_token_ids: Collection[int],
    ids: Sequence[int] = (),
) -> BeamSearch | None:
    """The request's beam search from its ``to_hf`` ``settings`` (None for ``num_beams`` 1): its limit is
    ``max_new_tokens`` within the context; pass no ``eos_token_ids`` for ``ignore_eos_token`` (no eos
    ends a hypothesis then). ``ids``: the request id, then its sample ids (``n`` > 1: the i-th best
    hypothesis is reported under ``ids[i]``)."""
    beams = int(settings.get("num_beams", 1))
    if beams <= 1:
        return None
    limit = max(1, min(int(settings["max_new_tokens"]), max_model_len - prompt_len))
    return BeamSearch(beams, limit, eos_token_ids, length_penalty=float(settings.get("length_penalty", 1.0)),
                      early_stopping=settings.get("early_stopping", False), ids=ids)


def release_beam(search: BeamSearch, request_id: int) -> bool:
    """One of the request's sequences was released; True once none is left (its rows may go)."""
    search.live.discard(request_id)
    return not search.live


def fork_beams(row: Row) -> list[Row]:
    """The further beam rows of ``row`` (its ``beam_forks``, emptied): same request, own sampler state."""
    forks = [replace(row, sampling=replace(row.sampling, seen=_clone(row.sampling.seen)), beam_slot=slot,
                     beam_forks=0, forks=[])
             for slot in range(1, row.beam_forks + 1)]
    row.beam_forks = 0
    return forks


def _clone(seen: torch.Tensor | None) -> torch.Tensor | None:
    return seen.clone() if seen is not None else None


def advance_beams(
    logits: torch.Tensor, rows: Sequence[Row], batch: Any, pending: list[int], prompt_lps: PromptLps
) -> list[StepOutput]:
    """One beam step for every beam request among ``rows`` (``logits`` [rows, vocab], row aligned):
    choose the beams, copy their KV rows within each request (``batch``: one index copy per layer for
    all of them), write each beam row's token into ``pending`` and return the requests' outputs
    (settled tokens, or the end). The log-softmax and its finiteness check run once over every beam row."""
    groups: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        if row.beam is not None and not row.done:
            groups.setdefault(id(row.beam), []).append(i)
    if not groups:
        return []
    for members in groups.values():
        members.sort(key=lambda i: rows[i].beam_slot)
    order = [i for members in groups.values() for i in members]
    raw_all = torch.log_softmax(logits[torch.tensor(order, device=logits.device)].float(), dim=-1).cpu()
    broken = (~torch.isfinite(raw_all).any(dim=-1) | torch.isnan(raw_all).any(dim=-1)).tolist()
    outputs: list[StepOutput] = []
    moves: tuple[list[int], list[int]] = ([], [])
    start = 0
    for members in groups.values():
        stop = start + len(members)
        beams = [rows[i] for i in members]
        lp = prompt_lps[members[0]] if prompt_lps is not None else None
        if any(broken[start:stop]):
            outputs += _fail(beams)
        else:
            outputs += _advance_one(raw_all[start:stop], beams, members, pending, lp, moves)
        start = stop
    if moves[0] and batch is not None:
        batch.copy_rows(*moves)
    return outputs


def _fail(beams: list[Row]) -> list[StepOutput]:
    search = beams[0].beam
    assert search is not None
    for row in beams:
        row.done = True
    return [StepOutput(rid, error="the model produced non-finite logits for this request")
            for rid in search.ids if rid in search.live]


def _advance_one(raw: torch.Tensor, beams: list[Row], index: list[int], pending: list[int],
                 prompt_lp: list[float | None] | None, moves: tuple[list[int], list[int]]) -> list[StepOutput]:
    """One request's step on its beams' log-probs ``raw`` (``beams`` in slot order at batch rows ``index``).
    A new beam takes over its parent's batch row where it is the parent's first child (no copy); a
    further child takes the row of a beam that has none, and that row's KV copy goes to ``moves``
    (src, dst): a request copies only as many KV rows as it has beams sharing a parent."""
    search = beams[0].beam
    assert search is not None
    search.step(_processed(raw, beams), raw)
    parents = search.parents
    free = [q for q in range(len(beams)) if q not in set(parents)]  # beams left without a child
    taken: set[int] = set()
    places: list[int] = []  # the slot (old) whose batch row beam j takes
    for p in parents:
        if p in taken:
            q = free.pop()
            moves[0].append(index[p])
            moves[1].append(index[q])
            beams[q].sampling.seen = _clone(beams[p].sampling.seen)
            places.append(q)
        else:
            taken.add(p)
            places.append(p)
    rows = [beams[q] for q in places]
    for j, (row, q, token) in enumerate(zip(rows, places, search.tokens, strict=True)):
        row.beam_slot = j
        pending[index[q]] = token
        row.sampling.observe(token)
    return _report(search, beams, prompt_lp)


def _processed(raw: torch.Tensor, beams: list[Row]) -> torch.Tensor:
    """The beams' log-probs after the request's processors, in transformers' order and formula:
    repetition penalty (each beam over its own prompt and tokens), then eos held off until
    ``min_new_tokens``."""
    sampling = beams[0].sampling
    if sampling.seen is None and sampling.generated >= sampling.min_new_tokens:
        return raw
    x = raw.clone()
    if sampling.seen is not None:
        seen = torch.stack([row.sampling.seen for row in beams if row.sampling.seen is not None]).to(x.device)
        penalty = sampling.repetition_penalty
        x = torch.where(seen, torch.where(x < 0, x * penalty, x / penalty), x)
    if sampling.generated < sampling.min_new_tokens and sampling.eos_token_ids:
        x[:, list(sampling.eos_token_ids)] = float("-inf")
    return x


def _report(search: BeamSearch, beams: list[Row], prompt_lp: list[float | None] | None) -> list[StepOutput]:
    """The request's outputs of this step (:func:`~djl_handlers.engines.hf.beams.beam_outputs`); its rows
    are done once the search ends."""
    if search.prompt_lps is None and prompt_lp is not None:
        search.prompt_lps = prompt_lp
    if search.done:
        for row in beams:
            row.done = True
    return beam_outputs(search)
