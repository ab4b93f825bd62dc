"""The rolling (continuous) batch: DJL's slot protocol on top of an engine.

DJL's Java front end identifies requests by position: every step it resends the whole list of
in-flight requests (new ones appended at the end, with their bodies; continuing ones with empty
bodies) and expects exactly one record per position back. A request leaves the list on both
sides once its record says ``last``. ``RollingBatch`` keeps the Python side of that list.

Errors are isolated: a request that fails to parse, tokenize or sample gets its own error record;
an exception from the engine's batched step fails only the requests that were in that step.
A request with several samples (``n``/``best_of`` > 1) is one slot holding one engine request id
per sample (:mod:`djl_handlers.scheduling.samples`); a request with several prompts is one slot
holding one engine request per prompt (:mod:`djl_handlers.scheduling.prompts`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any, Optional

from djl_handlers.engines.base import Engine, EngineRequest
from djl_handlers.errors import DjlHandlersError, message_of, safe_text, status_of
from djl_handlers.formatting.base import Formatter
from djl_handlers.params.samples import sample_count, sample_seed
from djl_handlers.request.records import Request
from djl_handlers.scheduling.media import prepare_media, takes_images, tokenize_media
from djl_handlers.scheduling.preparing import MediaPool, PreparingSlot
from djl_handlers.scheduling.prompts import PromptGroup, check_prompt_list, engine_ids
from djl_handlers.scheduling.reply_guard import ReplyGuard
from djl_handlers.scheduling.samples import SampleGroup, check_sample_format
from djl_handlers.scheduling.slot import RequestSlot, tokenize_prompt

LOG = logging.getLogger(__name__)

FormatterFactory = Callable[[Request], Any]
PREPARE_WAIT_S = 0.05  # how long a step with only preparing requests waits for one to be ready


class RollingBatch:
    """The Python half of DJL's rolling-batch loop for one engine."""

    def __init__(self, engine: Engine, formatter_factory: FormatterFactory) -> None:
        self.engine = engine
        self._formatter_factory = formatter_factory
        self.slots: list[RequestSlot] = []
        self._next_id = 0
        self._media = MediaPool()  # prepares requests' images off the step thread (scheduling/preparing.py)
        self._preparing = 0  # PreparingSlots in ``slots`` (a step looks for ready ones only when some are)
        # records shaped for DJL's HTTP writer (scheduling/reply_guard.py); None for our own front end
        self.guard: Optional[ReplyGuard] = None

    def __len__(self) -> int:
        return len(self.slots)

    # -- admission ---------------------------------------------------------------------------
    def add_request(self, request: Request) -> RequestSlot:
        """Append a parsed request; failures become an error slot, never an exception. A request whose
        images are not prepared yet takes its place as a ``PreparingSlot`` while a pool thread prepares
        them (:mod:`.preparing`); a later step admits it."""
        if request.media and request.encoded is None and takes_images(self.engine):
            try:
                formatter = self._formatter_factory(request)
            except DjlHandlersError as exc:
                slot = error_slot(exc, request, None, self._new_id())
            else:
                future = self._media.submit(prepare_media, self.engine, request)
                slot = PreparingSlot(request, formatter, self._new_id(), future)
                self._preparing += 1
            self.slots.append(slot)
            self._arrived(slot)
            return slot
        slot, engine_requests = self.prepare(request)
        self.slots.append(slot)
        self._arrived(slot)
        self._enter(slot, engine_requests)
        return slot

    def _enter(self, slot: RequestSlot, engine_requests: list[EngineRequest]) -> None:
        """Give ``slot``'s requests to the engine (a refusal fails the slot)."""
        try:
            for engine_request in engine_requests:
                self.engine.add_request(engine_request)
                slot.in_engine = True
        except Exception as exc:  # noqa: BLE001
            slot.fail(message_of(exc), status_of(exc))

    def _admit_prepared(self) -> None:
        """Put each ``PreparingSlot`` whose media are ready in its place as a real slot (or its error);
        with nothing else to step, wait briefly for one rather than spin."""
        if not self._preparing:
            return
        waiting = [s for s in self.slots if isinstance(s, PreparingSlot)]
        self._preparing = len(waiting)  # finished ones (cancelled, failed) are dropped after each step
        if not any(s.in_engine and not s.finished for s in self.slots):
            wait([s.future for s in waiting if not s.finished], timeout=PREPARE_WAIT_S, return_when=FIRST_COMPLETED)
        for index, slot in enumerate(self.slots):
            if not isinstance(slot, PreparingSlot) or slot.finished or not slot.future.done():
                continue
            self._preparing -= 1
            failure = slot.future.exception()
            if failure is not None:
                slot.fail(_naming_field(failure), status_of(failure), _field_of(failure))
                continue
            real, engine_requests = self._prepare_slot(slot.request, slot.formatter, slot.request_id)
            self.slots[index] = real
            self._enter(real, engine_requests)

    def prepare(self, request: Request) -> tuple[RequestSlot, list[EngineRequest]]:
        """A new slot for ``request`` and what to give the engine (empty: the slot already failed,
        e.g. its prompt does not tokenize or is too long; several for several prompts). Adds
        nothing to the batch."""
        slot_id = self._new_id()
        try:
            formatter = self._formatter_factory(request)
        except DjlHandlersError as exc:
            return error_slot(exc, request, None, slot_id), []
        return self._prepare_slot(request, formatter, slot_id)

    def _prepare_slot(self, request: Request, formatter: Formatter,
                      slot_id: int) -> tuple[RequestSlot, list[EngineRequest]]:
        """``prepare`` once the formatter is made."""
        try:
            check_sample_format(request, formatter)
            check_prompt_list(request)
            if request.per_prompt:
                parts = [self._prepare_one(part, formatter, self._new_id()) for part in request.per_prompt]
                group = PromptGroup(request, formatter, slot_id, [p for p, _ in parts], self._release_id)
                return group, [r for _, r in parts]
            slot, engine_request = self._prepare_one(request, formatter, slot_id)
        except Exception as exc:  # noqa: BLE001 - any tokenizer failure is this request's problem
            slot = RequestSlot(request, formatter, slot_id)
            slot.fail(_naming_field(exc), status_of(exc), _field_of(exc))
            return slot, []
        return slot, [engine_request]

    def _prepare_one(self, request: Request, formatter: Formatter, slot_id: int) -> tuple[RequestSlot, EngineRequest]:
        """The slot of one prompt (a ``SampleGroup`` for several samples) and its engine request."""
        media = None
        if request.media:
            prompt_ids, media = tokenize_media(self.engine, request)
        else:
            prompt_ids = self._tokenize(request)
        adapter = request.adapter_of(0)
        if sample_count(request.params) > 1:
            ids = [slot_id, *(self._new_id() for _ in range(sample_count(request.params) - 1))]
            group = SampleGroup(request, formatter, ids, prompt_ids, tokenizer=self.engine.tokenizer,
                                eos_token_ids=self.engine.eos_token_ids, max_model_len=self.engine.max_model_len,
                                release=self._release_id, seed_of=getattr(self.engine, "sample_seed", sample_seed))
            return group, EngineRequest(slot_id, prompt_ids, request.params, request.prompt, adapter, tuple(ids[1:]),
                                        session=request.session, media=media)
        slot = RequestSlot(
            request,
            formatter,
            slot_id,
            prompt_ids,
            tokenizer=self.engine.tokenizer,
            eos_token_ids=self.engine.eos_token_ids,
            max_model_len=self.engine.max_model_len,
        )
        return slot, EngineRequest(slot_id, prompt_ids, request.params, request.prompt, adapter,
                                   session=request.session, media=media)

    def add_error(
        self, exc: BaseException, request: Optional[Request] = None, formatter: Optional[Formatter] = None
    ) -> RequestSlot:
        """Append a slot for a request that could not be parsed; it reports the error at once,
        rendered by ``formatter`` (the request's API dialect; default: DJL's LMI rendering)."""
        slot = error_slot(exc, request, formatter, self._new_id())
        self.slots.append(slot)
        self._arrived(slot)
        return slot

    def _arrived(self, slot: RequestSlot) -> None:
        if self.guard is not None:
            self.guard.arrived(slot.request_id)

    def _tokenize(self, request: Request) -> list[int]:
        return tokenize_prompt(self.engine, request)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- stepping ----------------------------------------------------------------------------
    def cancel(self, index: int) -> None:
        """Finish the request at ``index`` (its client went away)."""
        if 0 <= index < len(self.slots):
            self.slots[index].cancel()

    def step(self) -> list[tuple[dict[str, Any], str]]:
        """Advance every request by one step; return one (record, content type) per slot, in
        order, and drop finished slots."""
        self._admit_prepared()
        guard = self.guard
        if guard is not None and self.slots and all(s.finished and guard.holds(s.request_id) for s in self.slots):
            time.sleep(guard.wait_s())  # only held replies: wait for the first to be due, not spin
        self._run_engine()
        results: list[tuple[dict[str, Any], str]] = []
        for slot in self.slots:
            if slot.finished and slot.in_engine:
                self._release(slot)
            if guard is None:
                record = slot.record()
            else:  # a slot whose last record is held has nothing new to give
                record = guard.shape(slot.request_id, {} if guard.holds(slot.request_id) else slot.record())
            results.append((record, slot.content_type))
        self.slots = [s for s in self.slots if not s.finished or (guard is not None and guard.holds(s.request_id))]
        return results

    def _run_engine(self) -> None:
        if not any(s.in_engine and not s.finished for s in self.slots):
            return
        by_id = {rid: s for s in self.slots if s.in_engine for rid in engine_ids(s)}
        try:
            outputs = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - the batch failed; fail its members only
            LOG.exception("engine step failed; failing the requests in it")
            for slot in set(by_id.values()):
                slot.fail(f"engine step failed: {message_of(exc)}", status_of(exc))
            return
        for out in outputs:
            target = by_id.get(out.request_id)
            if target is not None:
                target.consume(out)

    def _release(self, slot: RequestSlot) -> None:
        slot.in_engine = False
        for request_id in engine_ids(slot):
            self._release_id(request_id)
        if isinstance(slot, (SampleGroup, PromptGroup)):
            slot.released()

    def _release_id(self, request_id: int) -> None:
        try:
            self.engine.release(request_id)
        except Exception:  # noqa: BLE001 - releasing must never break the batch
            LOG.exception("engine.release(%s) failed", request_id)

    def reset(self) -> None:
        """Drop every request (DJL sends ``reset_rollingbatch`` after a failure)."""
        for slot in self.slots:
            if slot.in_engine:
                self._release(slot)
        self.slots = []
        self._preparing = 0
        if self.guard is not None:
            self.guard.clear()


def error_slot(exc: BaseException, request: Optional[Request] = None, formatter: Optional[Formatter] = None,
               slot_id: int = 0) -> RequestSlot:
    """A finished slot whose one record reports ``exc`` (rendered by ``formatter``, default LMI's json)."""
    from djl_handlers.dialects.registry import get_formatter

    slot = RequestSlot(request or _error_request(), formatter or get_formatter("json", stream=False), slot_id)
    slot.fail(_naming_field(exc), status_of(exc), _field_of(exc))
    return slot


def _error_request() -> Request:
    from djl_handlers.params.generation import GenerationParameters

    return Request(prompt="", params=GenerationParameters())


def _field_of(exc: BaseException) -> Optional[str]:
    """The request field a refusal names (None for other failures)."""
    field = getattr(exc, "field", None) if isinstance(exc, DjlHandlersError) else None
    return str(field) if field else None


def _naming_field(exc: BaseException) -> str:
    """The error text of a rolling-batch record, naming the field: DJL's front end sends only
    ``{"error", "code"}`` for a record, so a field the message does not mention is prefixed."""
    message = message_of(exc)
    field = safe_text(str(getattr(exc, "field", None) or ""))  # sendable, as the message is
    if isinstance(exc, DjlHandlersError) and field and field not in message and repr(field)[1:-1] not in message:
        return f"{field}: {message}"
    return message
