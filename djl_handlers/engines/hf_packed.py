"""The packed step of the transformers engine (``option.hf_step=packed``; ``padded`` stays the
default: on CPU the two measured equal within noise, see docs/benchmarks.md §7).

One model forward per step over a ragged pack of tokens (vLLM's layout, on the model's own
transformers layers): the pending token of every decoding request, then the prompt chunks
admitted this step (at most ``max_prefill_tokens`` prompt tokens, real tokens only: nothing is
padded). Keys/values go to one slot per request (:mod:`~djl_handlers.engines.hf_paged_kv`), so
requests join and leave without copying anybody's cache; attention is
:func:`~djl_handlers.engines.hf_packed_attn.packed_attention`. Logits are computed only for the
pack positions that need a next token (decode tokens and the last token of a completed prompt),
then :meth:`HFEngine._emit` samples exactly as in the padded path (same ``sample_batch``, same
per-row hooks on the logits).

Scheduling per step (FIFO, like the padded path): every running request decodes; a prompt cut
short by the budget last step continues first (chunked prefill, one chunk per step); then queued
prompts are admitted while rows and budget remain, the last one possibly cut into a chunk. A
step's forward failing while it carries prompts fails those requests only: the step is retried
with the decode tokens alone. A failure of that fails the whole running batch (as the padded path).

Greedy output in fp32 equals ``model.generate()`` of each request alone (tested like the padded path).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from djl_handlers.engines.base import StepOutput
from djl_handlers.engines.hf_engine import HFEngine, _Row
from djl_handlers.engines.hf_packed_attn import build_meta, packed_mode
from djl_handlers.engines.hf_paged_kv import SlotKV
from djl_handlers.engines.hf_prefill import prompt_lps
from djl_handlers.errors import ConfigError

LOG = logging.getLogger(__name__)


@dataclass
class _Seq:
    """A request holding a KV slot: being prefilled (``offset`` < prompt length) or decoding."""

    row: _Row
    slot: int
    offset: int = 0  # prompt tokens already in the KV
    length: int = 0  # tokens in the KV (= position id of the pending token once decoding)
    pending: int = -1  # the last sampled token, fed at the next step
    prompt_lps: list[float | None] | None = None

    @property
    def decoding(self) -> bool:
        return self.offset >= len(self.row.request.prompt_ids)


@dataclass
class _Plan:
    """One step's pack: decode rows, then (seq, first prompt index, token count) chunks."""

    decode: list[_Seq]
    chunks: list[tuple[_Seq, int, int]]


class PackedHFEngine(HFEngine):
    """:class:`HFEngine` with the packed, slot-KV step (see module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, **kwargs: Any) -> None:
        super().__init__(model, tokenizer, **kwargs)
        if not supports_packed(model):
            raise ConfigError(
                f"{type(model).__name__} does not take transformers' attention functions; "
                "use option.hf_step=padded",
                field="option.hf_step",
            )
        layers = int(getattr(model.config, "num_hidden_layers", 0) or len(_decoder_layers(model)))
        self._kv = SlotKV(layers=layers, max_len=self.max_model_len)
        self._seqs: list[_Seq] = []  # slot holders in admission order (decoding and prefilling)

    @classmethod
    def load(cls, config: Any = None, **kwargs: Any) -> HFEngine:
        """Load like :meth:`HFEngine.load`; a model the packed step cannot drive gets the padded one."""
        from djl_handlers.engines.hf_loader import LoadOptions, load_model_and_tokenizer

        engine_keys = ("max_batch_size", "max_prefill_tokens", "max_model_len")
        engine_kwargs = {k: kwargs.pop(k) for k in engine_keys if kwargs.get(k) is not None}
        model, tokenizer = load_model_and_tokenizer(LoadOptions.from_config(config, **kwargs))
        if supports_packed(model):
            return cls(model, tokenizer, **engine_kwargs)
        LOG.warning("%s: packed step not supported (custom attention); using option.hf_step=padded",
                    type(model).__name__)
        return HFEngine(model, tokenizer, **engine_kwargs)

    # ------------------------------------------------------------------ protocol
    def _advance(self) -> list[StepOutput]:
        """One packed forward: every decoding request gets a token, admitted prompts advance."""
        outputs = self._fail_full()
        plan = self._plan()
        if plan.decode or plan.chunks:
            outputs += self._run(plan)
        return outputs

    def release(self, request_id: int) -> None:
        """Forget a request; its slot is free at once (nothing is copied)."""
        if not self._forget(request_id):
            return
        for seq in self._seqs:
            if seq.row.request.request_id == request_id:
                self._free(seq)
                return

    @property
    def running_ids(self) -> tuple[int, ...]:
        """Decoding request ids in admission order."""
        return tuple(s.row.request.request_id for s in self._seqs if s.decoding)

    @property
    def kv_shape(self) -> tuple[int, int]:
        """(requests holding a slot, longest KV length among them); (0, 0) when empty."""
        if not self._seqs:
            return (0, 0)
        return (len(self._seqs), max(s.length for s in self._seqs))

    # ------------------------------------------------------------------ internals
    def _free(self, seq: _Seq) -> None:
        self._seqs.remove(seq)
        self._kv.release(seq.slot)

    def _drop_running(self) -> None:
        for seq in list(self._seqs):
            self._free(seq)
        self._ids = {row.request.request_id for row in self._queue}

    def _fail_full(self) -> list[StepOutput]:
        """Error out decoding rows whose next token would not fit the context."""
        errors = []
        for seq in [s for s in self._seqs if s.decoding and s.length + 2 > self.max_model_len]:
            rid = seq.row.request.request_id
            self._ids.discard(rid)
            self._free(seq)
            errors.append(
                StepOutput(rid, error=f"the request reached the model's context length ({self.max_model_len} tokens)")
            )
        return errors

    def _plan(self) -> _Plan:
        budget = self.max_prefill_tokens
        decode = [s for s in self._seqs if s.decoding]
        chunks: list[tuple[_Seq, int, int]] = []
        for seq in self._seqs:  # a prompt cut short last step continues first
            if not seq.decoding and budget > 0:
                n = min(budget, len(seq.row.request.prompt_ids) - seq.offset)
                chunks.append((seq, seq.offset, n))
                budget -= n
        while self._queue and budget > 0 and len(self._seqs) < self.max_batch_size:
            row = self._queue.popleft()
            seq = _Seq(row, self._kv.acquire())
            self._seqs.append(seq)
            n = min(budget, len(row.request.prompt_ids))
            chunks.append((seq, 0, n))
            budget -= n
        return _Plan(decode, chunks)

    def _run(self, plan: _Plan) -> list[StepOutput]:
        try:
            logits, hidden = self._packed_forward(plan)
        except Exception as exc:  # noqa: BLE001 - a bad prompt fails its own requests only
            if not plan.chunks:
                raise
            LOG.exception("packed step with %d prompt chunk(s) failed", len(plan.chunks))
            failed = [seq.row for seq, _, _ in plan.chunks]
            for seq, _, _ in plan.chunks:
                self._free(seq)
            outputs = self._fail_rows(failed, f"prefill failed: {type(exc).__name__}: {exc}")
            if plan.decode:
                outputs += self._run(_Plan(plan.decode, []))
            return outputs
        return self._finish(plan, logits, hidden)

    def _packed_forward(self, plan: _Plan) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The step's forward: logits [rows needing a token, vocab] (float32) and, when a chunk's
        request asked for prompt log-probs, the final hidden states [1, N, hidden]."""
        ids: list[int] = [s.pending for s in plan.decode]
        pos: list[int] = [s.length for s in plan.decode]
        keep: list[int] = list(range(len(plan.decode)))  # pack positions whose logits are computed
        sample = list(keep)  # indices into keep of the rows that get a token
        at = len(ids)
        for seq, start, n in plan.chunks:
            prompt = seq.row.request.prompt_ids
            ids += list(prompt[start : start + n])
            pos += list(range(start, start + n))
            at += n
            if start + n >= len(prompt):
                sample.append(len(keep))
                keep.append(at - 1)
            elif seq.row.prompt_lp:
                keep.append(at - 1)  # checks the output head against the model's logits
        longest = max(pos) + 1
        meta = build_meta(
            self._kv,
            [(s.slot, s.length) for s in plan.decode],
            [(seq.slot, start, n) for seq, start, n in plan.chunks],
            self.device,
        )
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        position_ids = torch.tensor([pos], dtype=torch.long, device=self.device)
        want_hidden = any(seq.row.prompt_lp for seq, _, _ in plan.chunks)
        captured: list[torch.Tensor] = []
        handle = None
        if want_hidden:
            handle = self.model.base_model.register_forward_hook(lambda _m, _a, out: captured.append(out[0]))
        try:
            embed = self.model.get_input_embeddings()
            self._kv.reserve(longest, _kv_like(self.model, embed.weight))
            with packed_mode(self.model):
                out = self.model(
                    input_ids=input_ids,
                    position_ids=position_ids,
                    use_cache=False,
                    logits_to_keep=torch.tensor(keep, dtype=torch.long, device=self.device),
                    djl_packed=meta,
                )
        finally:
            if handle is not None:
                handle.remove()
        logits = out.logits[0].float()
        hidden = captured[-1] if captured else None
        if hidden is not None:  # the head must reproduce the logits, else prompt log-probs are unknown
            check = self.model.get_output_embeddings()(hidden[:, keep[-1]]).float()
            if not torch.allclose(check, logits[-1:], rtol=1e-3, atol=1e-3):
                LOG.warning("%s: prompt log-probs are not available (its logits are not lm_head(hidden))",
                            type(self.model).__name__)
                hidden = None
        if len(sample) < len(keep):
            logits = logits[sample]
        return logits, hidden

    def _finish(self, plan: _Plan, logits: torch.Tensor, hidden: torch.Tensor | None) -> list[StepOutput]:
        """Advance the KV lengths, collect prompt log-probs, sample the rows that need a token."""
        rows: list[_Seq] = []
        for seq in plan.decode:
            seq.length += 1
            rows.append(seq)
        at = len(plan.decode)
        for seq, start, n in plan.chunks:
            prompt = seq.row.request.prompt_ids
            if seq.row.prompt_lp:
                targets = list(prompt[start + 1 : start + n + 1])  # position j predicts token j + 1
                seq.prompt_lps = prompt_lps(
                    self.model, hidden, 0, at, at + len(targets), targets, seq.prompt_lps or [None]
                )
            seq.offset = seq.length = start + n
            at += n
            if seq.decoding:
                rows.append(seq)
        if not rows:
            return []
        lps = [s.prompt_lps if (s.row.prompt_lp and s.row.sampling.generated == 0) else None for s in rows]
        outputs = self._emit(logits, [s.row for s in rows], None, lps if any(x is not None for x in lps) else None)
        for seq, out in zip(rows, outputs, strict=True):
            if out.error is not None:
                self._free(seq)
            else:
                seq.pending = int(out.token_id) if out.token_id is not None else 0
        return outputs


def _kv_like(model: Any, weight: torch.Tensor) -> torch.Tensor:
    """A [1, kv_heads, 1, head_dim] tensor of the KV dtype/device (sizes the slabs)."""
    config = model.config
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    return weight.new_empty((1, heads, 1, dim))


def _decoder_layers(model: Any) -> list[Any]:
    """The decoder layers (when the config does not say how many)."""
    return list(getattr(model.base_model, "layers", []))


def supports_packed(model: Any) -> bool:
    """True when the model's attention layers call transformers' pluggable attention functions
    (``_supports_attention_backend``), which the packed step replaces for its forwards."""
    return bool(getattr(model, "_supports_attention_backend", False))
