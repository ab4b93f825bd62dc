"""A deterministic engine with a byte-level tokenizer, for tests, docs and examples.

It needs no ML library. Every request answers with the bytes of a fixed text (cycled), so
outputs are predictable; sampling with a seed picks a per-seed rotation of that text (the samples
of an ``n``/``best_of`` request: one rotation per sample seed). Control
markers inside the prompt exercise error paths:

- ``<eos@N>``: emit the eos token as the N-th generated token;
- ``<fail@N>``: report an error for this request at its N-th token (others continue);
- ``<crash>``: raise from ``step()`` (the whole batch step fails).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Optional

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.errors import InvalidParameter
from djl_handlers.params.samples import check_samples, sample_seed
from djl_handlers.params.translate import is_sampling

REPLY = "The quick brown fox jumps over the lazy dog. "
EOS_ID = 256
BOS_ID = 257
_MARK = re.compile(r"<(eos|fail)@(\d+)>")


class ByteTokenizer:
    """Token id = UTF-8 byte value; 256 is eos ``</s>``, 257 is bos ``<s>``."""

    eos_token_id = EOS_ID
    bos_token_id = BOS_ID
    eos_token = "</s>"
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        specials = {EOS_ID: "</s>", BOS_ID: "<s>"}
        out = bytearray()
        text = ""
        for i in ids:
            if i in specials:
                text += out.decode("utf-8", errors="replace")
                out = bytearray()
                if not skip_special_tokens:
                    text += specials[i]
            else:
                out.append(i)
        return text + out.decode("utf-8", errors="replace")


class _Row:
    __slots__ = ("request", "generated", "reply", "eos_at", "fail_at")

    def __init__(self, request: EngineRequest, reply: bytes, eos_at: Optional[int], fail_at: Optional[int]):
        self.request = request
        self.generated = 0
        self.reply = reply
        self.eos_at = eos_at
        self.fail_at = fail_at


class FakeEngine:
    """Implements the Engine protocol deterministically; see the module docstring."""

    name = "fake"

    def __init__(self, max_model_len: int = 2048, reply: str = REPLY) -> None:
        self.tokenizer = ByteTokenizer()
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset({EOS_ID})
        self._reply = reply.encode("utf-8")
        self._rows: dict[int, _Row] = {}
        self.steps = 0
        self.released: list[int] = []

    @classmethod
    def from_config(cls, config: Any) -> FakeEngine:
        raw: Mapping[str, str] = getattr(config, "raw", {}) or {}
        return cls(max_model_len=int(raw.get("max_model_len", 2048)), reply=raw.get("fake_reply", REPLY))

    def check_parameters(self, params: Any) -> None:
        """The fake engine cannot constrain its canned reply: structured output is a 400; several
        samples need sampling."""
        check_samples(params, is_sampling(params))
        constraint = params.structured_output
        if constraint is not None:
            raise InvalidParameter(
                f"{constraint.describe()}: structured output is not supported by engine fake", field=constraint.source
            )

    def add_request(self, request: EngineRequest) -> None:
        self.check_parameters(request.params)
        marks = {k: int(v) for k, v in _MARK.findall(request.prompt)}
        params = request.params
        for index, request_id in enumerate((request.request_id, *request.sample_ids)):
            reply = self._reply
            if is_sampling(params):
                shift = random.Random(sample_seed(params.seed, index)).randrange(len(reply))
                reply = reply[shift:] + reply[:shift]
            sample = replace(request, request_id=request_id, sample_ids=())
            self._rows[request_id] = _Row(sample, reply, marks.get("eos"), marks.get("fail"))

    def step(self) -> list[StepOutput]:
        self.steps += 1
        if any("<crash>" in r.request.prompt for r in self._rows.values()):
            raise RuntimeError("fake engine crashed on purpose")
        outputs = []
        for rid, row in self._rows.items():
            row.generated += 1
            n = row.generated
            if row.fail_at == n:
                outputs.append(StepOutput(rid, error=f"fake failure at token {n}"))
                continue
            token = EOS_ID if row.eos_at == n else row.reply[(n - 1) % len(row.reply)]
            outputs.append(StepOutput(rid, token_id=token, log_prob=-0.125 * (n % 4)))
        return outputs

    def release(self, request_id: int) -> None:
        self._rows.pop(request_id, None)
        self.released.append(request_id)

    def has_unfinished(self) -> bool:
        return bool(self._rows)

    def generate_static(self, requests: Sequence[EngineRequest]) -> list[list[StepOutput]]:
        """Dynamic-batch path: run each request to max_new_tokens (the slot applies stops)."""
        results = []
        for req in requests:
            self.add_request(req)
            outs: list[StepOutput] = []
            row = self._rows[req.request_id]
            for _ in range(req.params.max_new_tokens):
                row.generated += 1
                n = row.generated
                token = EOS_ID if row.eos_at == n else row.reply[(n - 1) % len(row.reply)]
                outs.append(StepOutput(req.request_id, token_id=token, log_prob=-0.125 * (n % 4)))
                if token == EOS_ID:
                    break
            self.release(req.request_id)
            results.append(outs)
        return results
