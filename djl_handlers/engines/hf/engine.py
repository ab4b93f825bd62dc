"""The transformers engine: our own continuous batching over the model's forward.

Batch layout: one running batch of ``B`` rows, left-padded to a common length ``T``. The KV cache
(a ``DynamicCache``, per layer ``keys``/``values`` of shape [B, kv_heads, T, head_dim]) holds every
token of a row except its pending token (the one sampled last, fed at the next decode). ``mask``
[B, T] marks real positions; ``pos`` [B] is each row's true length (= position id of the pending
token). A step:

1. drops rows released or failed since the last step (``KVBatch.select``: the last rows move into
   their holes) and trims the left padding they leave behind;
2. decodes one token for every running row (one forward of [B, 1]);
3. prefills queued prompts within ``max_prefill_tokens`` (padded tokens count; first fit in
   arrival order: a prompt that does not fit what is left of the step's budget lets shorter ones
   behind it go first; a prompt longer than the budget is prefilled in chunks over several steps,
   one chunk per step, and nobody overtakes it), samples their first token and merges their KV
   into the running batch (zero-padded on the left, masked).

Greedy output in fp32 equals ``model.generate()`` of each request alone: padding is masked and
every row gets explicit position ids. The engine never finishes a row itself; the scheduler calls
``release``. The only exception: a row that would exceed ``max_model_len`` gets
``StepOutput(error=...)`` and is dropped.

Structured output (``parameters.guided_*``): see :mod:`djl_handlers.engines.hf.grammar`. The
constraint is checked in ``add_request`` (400 when invalid) and compiled on a background thread;
the request waits in the queue (others go ahead) until its grammar is ready. Each constrained row
has its own matcher; its bitmask is applied to a copy of the logits before sampling, so rows
without constraints in the same step are computed exactly as before.

Several samples of one prompt (``n``/``best_of``, ``EngineRequest.sample_ids``): the prompt is
prefilled once and its KV row forked into one row per sample right after the prefill forward
(:mod:`djl_handlers.engines.hf.forks`); a queued request needs a free row per sample to be admitted.
Beam search (``num_beams``) forks the same way, one row per beam, and copies KV rows within the
request as its beams move (:mod:`djl_handlers.engines.hf.beam_rows`).

Prefix caching (``option.enable_prefix_caching``, :mod:`djl_handlers.engines.hf.prefix_cache`): a
queued prompt whose first blocks are cached starts as a chunked prefill from the cached KV (the
first ready row, ahead of the step's group); every finished prompt prefill stores its blocks.

Speculative decoding by prompt lookup (``option.speculative_config``, method ``ngram``,
:mod:`djl_handlers.engines.hf.speculative`): a decode step may verify candidate tokens per row in one
``[B, 1 + K]`` forward and emit several tokens for a row; the step is the plain one when no row has
a candidate.

Log-probs: see :mod:`djl_handlers.engines.hf.sampling` (model distribution, before processing).
Only for rows that ask: ``top_n_tokens`` adds each token's most likely alternatives
(``StepOutput.top_tokens``); ``decoder_input_details`` adds the prompt tokens' log-probs to the
first output (``StepOutput.prompt_logprobs``), from the final hidden states of the same prefill
forward (captured by a hook, so the sampled first token is computed exactly as without it);
with both, each prompt position's top tokens too (``StepOutput.prompt_top_tokens``).
"""

from __future__ import annotations

import inspect
import logging
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from djl_handlers.config.hf import DEFAULT_PREFILL_TOKENS
from djl_handlers.engines.base import EngineRequest, StepOutput, check_prompt_length
from djl_handlers.engines.hf.batch import (
    KVBatch,
    left_pad,
    new_slab_cache,
    uses_plain_layers,
)
from djl_handlers.engines.hf.beam_rows import (
    PromptLps,
    advance_beams,
    beam_search_for,
    check_beams,
    release_beam,
)
from djl_handlers.engines.hf.cpu.threads import ThreadGovernor
from djl_handlers.engines.hf.decode_graphs import DecodeGraphs, capture_sizes, resolve_mode
from djl_handlers.engines.hf.forks import check_sample_rows, fan_out, fork_rows
from djl_handlers.engines.hf.kv_budget import bytes_per_token, footprint, kv_limit
from djl_handlers.engines.hf.kv_dtype import resolve_kv_dtype
from djl_handlers.engines.hf.lora import admits_row, attach_lora, require_lora, use_rows
from djl_handlers.engines.hf.planner import first_ready, starts_chunked, take_group
from djl_handlers.engines.hf.prefill import forward_capturing, prompt_lps
from djl_handlers.engines.hf.prefill_budget import default_prefill_tokens
from djl_handlers.engines.hf.prefix_cache import PrefixCache, prompt_kv
from djl_handlers.engines.hf.rows import Partial, Row
from djl_handlers.engines.hf.sampling import RowSampling, sample_batch
from djl_handlers.engines.hf.slab_ledger import SlabLedger
from djl_handlers.engines.hf.speculative import Speculator
from djl_handlers.engines.hf.static import generate_static as static_generate
from djl_handlers.engines.hf.vision import RowImages
from djl_handlers.errors import ConfigError, EngineOutOfMemory, InvalidRequest
from djl_handlers.params.translate import translate

if TYPE_CHECKING:
    from djl_handlers.config.media import MediaOptions
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.hf.grammar import GrammarBackend
    from djl_handlers.engines.hf.vision import VisionSupport
    from djl_handlers.media.records import LoadedImage, MediaInputs

LOG = logging.getLogger(__name__)


class HFEngine:
    """Continuous-batching engine over a transformers causal LM (see module docstring)."""

    name = "huggingface"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 32,
        max_prefill_tokens: int = DEFAULT_PREFILL_TOKENS,
        max_model_len: int | None = None,
        kv_cache_max_bytes: int | None = None,
    ) -> None:
        if max_batch_size < 1 or max_prefill_tokens < 1:
            raise ConfigError("max_batch_size and max_prefill_tokens must be positive")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        config = model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        model_len = int(getattr(text, "max_position_embeddings", 0) or 0) or 2048
        self.max_model_len = min(model_len, max_model_len) if max_model_len else model_len
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self.device = next(model.parameters()).device
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = "logits_to_keep" if "logits_to_keep" in params else None
        head = model.get_output_embeddings()
        rows = getattr(head, "out_features", None)  # an int8 head (option.quantize) keeps no weight
        self._vocab = int(rows if rows is not None else head.weight.shape[0]) if head is not None else int(
            text.vocab_size)
        self._check_cache_layout()
        self._queue: deque[Row] = deque()
        self._partial: Partial | None = None
        self._batch: KVBatch | None = None
        self._ids: set[int] = set()
        self.lora: Any = None  # a LoraSet when option.enable_lora=true (see engines/hf/lora.py)
        self._grammars: GrammarBackend | None = None
        self.threads: ThreadGovernor | None = None  # option.cpu_threads=adaptive on a CPU (engines/hf/cpu/threads.py)
        self.prefix_cache: PrefixCache | None = None  # option.enable_prefix_caching (engines/hf/prefix_cache.py)
        self.speculator: Speculator | None = None  # option.speculative_config (engines/hf/speculative.py)
        self.cpu_patches: dict[str, str] = {}  # what each CPU kernel patch did to the model (engines/hf/cpu/patches.py)
        self.kv_dtype: torch.dtype | None = None  # option.kv_cache_dtype: the slabs' type (None: the model's)
        self.kv_bytes_per_token = bytes_per_token(model)
        self.slabs = SlabLedger()  # what the KV slabs allocate, within the bound (engines/hf/slab_ledger.py)
        self.kv_cache_max_bytes = kv_cache_max_bytes  # None: no bound (engines/hf/kv_budget.py)
        self.decode_graphs: DecodeGraphs | None = None  # option.decode_graphs (engines/hf/decode_graphs.py)
        self.vision: VisionSupport | None = None  # a vision-language model's processor (engines/hf/vision.py)
        self.media_options: MediaOptions | None = None  # its image limits (config/media.py); None: text only

    @property
    def kv_cache_max_bytes(self) -> int | None:
        """The KV bound in bytes (None: none): admission reserves within it, the slabs and the decode
        graphs' mirror allocate within it (the ledger holds it)."""
        return self.slabs.limit

    @kv_cache_max_bytes.setter
    def kv_cache_max_bytes(self, limit: int | None) -> None:
        self.slabs.limit = limit

    @classmethod
    def from_config(cls, config: ServingConfig) -> HFEngine:
        """Build from a ``ServingConfig`` (registry entry point): the model and tokenizer as
        :class:`~djl_handlers.engines.hf.loader.LoadOptions` takes them from ``config``, the limits of
        :func:`step_limits`, LoRA (``option.enable_lora``) and, with ``option.cpu_threads=adaptive`` on a
        CPU, a :class:`~djl_handlers.engines.hf.cpu.threads.ThreadGovernor`. Every option is typed in
        ``config.hf`` (:mod:`djl_handlers.config.hf`)."""
        engine = attach_lora(config, cls.load(config))
        if config.hf.enable_prefix_caching:
            engine.prefix_cache = PrefixCache(config.hf.prefix_cache_memory_bytes)
            engine.prefix_cache.image_token = engine.vision.image_token_id if engine.vision is not None else None
        if config.hf.speculative is not None:
            engine.speculator = Speculator(config.hf.speculative)
        if config.hf.cpu_threads == "adaptive" and engine.device.type == "cpu" and torch.get_num_threads() > 1:
            engine.threads = ThreadGovernor(torch.get_num_threads())
        mode = resolve_mode(config.hf.decode_graphs, engine.device, config.hf.enforce_eager)
        if mode != "off" and engine.speculator is not None:  # verify steps change the slab behind its mirror
            LOG.warning("option.decode_graphs=%s is not used with option.speculative_config", mode)
        elif mode != "off":
            engine.use_decode_graphs(mode, config.hf.cudagraph_capture_sizes)
        return engine

    @classmethod
    def load(cls, config: ServingConfig) -> HFEngine:
        """Load model and tokenizer as ``config`` says and step them."""
        from djl_handlers.engines.hf.loader import LoadOptions, load_model

        loaded = load_model(LoadOptions.from_config(config))
        engine = cls(loaded.model, loaded.tokenizer, **step_limits(config))
        engine.cpu_patches = loaded.cpu_patches
        if loaded.processor is not None:
            from djl_handlers.engines.hf.vision import VisionSupport

            engine.vision = VisionSupport(loaded.model, loaded.processor)
            engine.media_options = config.media
        if config.hf.max_prefill_tokens is None:
            engine.max_prefill_tokens = default_prefill_tokens(engine.device)
        engine.use_kv_dtype(resolve_kv_dtype(config.hf.kv_cache_dtype, engine.model))
        engine.kv_cache_max_bytes = kv_limit(config.hf.kv_cache_memory_bytes, engine.device, engine.kv_bytes_per_token)
        return engine

    # ------------------------------------------------------------------ protocol
    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; it is prefilled at a coming ``step``."""
        check_prompt_length(len(request.prompt_ids), self.max_model_len)
        self._check_kv_room(request)
        ids = [request.request_id, *request.sample_ids]
        if self._ids.intersection(ids) or len(set(ids)) < len(ids):
            raise ValueError(f"request id {ids} is already in the engine")
        params = request.params
        constraint = self.check_parameters(params)
        compiling = self.grammar_backend().submit(constraint) if constraint is not None else None
        settings = translate(params, self.name)  # to_hf / to_deepspeed: the one greedy rule
        sampling = RowSampling.from_settings(settings, params.seed, request.prompt_ids, self._vocab, self.eos_token_ids,
                                             self.tokenizer)
        lora = require_lora(self).resolve(request.adapter) if request.adapter else None
        images = self._row_images(request)
        self._ids.update(ids)
        row = Row(request, sampling, prompt_lp=params.decoder_input_details, top_n=params.top_n_tokens, lora=lora,
                   compiling=compiling, forks=list(enumerate(request.sample_ids, start=1)))
        eos = () if params.ignore_eos_token else self.eos_token_ids  # as the scheduler's stop rule
        row.beam = beam_search_for(settings, len(request.prompt_ids), self.max_model_len, eos, ids)
        if row.beam is not None:  # one row per beam; the sample ids report hypotheses, not rows
            row.beam_forks, row.forks = row.beam.num_beams - 1, []
        row.images = images
        self._queue.append(row)

    @property
    def image_placeholder(self) -> str:
        """The text that stands for one image in a prompt (empty for a text model)."""
        return self.vision.image_token if self.vision is not None else ""

    def encode_media(self, prompt: str, images: Sequence[LoadedImage],
                     add_special_tokens: bool | None = None) -> tuple[list[int], MediaInputs]:
        """A vision-language prompt's token ids (image placeholders expanded by the model's processor)
        and its media (:mod:`.vision`); a 400 naming ``messages`` for a text-only model."""
        if self.vision is None:
            raise InvalidRequest("this model takes text only: remove the image parts", field="messages")
        return self.vision.encode(prompt, images, add_special_tokens)

    def _row_images(self, request: EngineRequest) -> RowImages | None:
        media = request.media
        if media is None or not media.images:
            return None
        if self.vision is None:
            raise InvalidRequest("this model takes text only: remove the image parts", field="messages")
        token = self.vision.image_token_id
        return RowImages(media, tokens=sum(1 for t in request.prompt_ids if t == token))

    def check_parameters(self, params: Any) -> Any:
        """Reject what this engine cannot do for ``params`` (``InvalidParameter``, a 400): a
        structured-output constraint the grammar compiler rejects, greedy ``n``/``best_of`` > 1 or more
        samples than batch rows, beams it cannot run (:func:`.beam_rows.check_beams`). Returns the
        constraint or None."""
        check_beams(params, self.max_batch_size, speculation=self.speculator is not None,
                    graphs=self.decode_graphs is not None)
        check_sample_rows(params, self.max_batch_size)
        constraint = params.structured_output
        if constraint is not None:
            self.grammar_backend().check(constraint)
        return constraint

    def step(self) -> list[StepOutput]:
        """Advance every active request by one token (decode), then admit queued prompts (prefill)."""
        governor = self.threads
        started = governor.start() if governor is not None else 0.0
        try:
            with torch.inference_mode():
                outputs = self._advance()
        except torch.OutOfMemoryError as exc:
            self._drop_running()
            raise EngineOutOfMemory(f"out of memory during a batch step: {exc}") from exc
        except Exception:
            self._drop_running()
            raise
        if governor is not None:
            governor.finish(started)
        return outputs

    def _advance(self) -> list[StepOutput]:
        """The step itself (inside ``step``'s inference mode and failure handling)."""
        outputs = self._compact()
        outputs += self._decode()
        outputs += self._prefill()
        return outputs

    def _forget(self, request_id: int) -> bool:
        """Drop ``request_id``'s bookkeeping and its queued (or chunk-prefilling) row; True when it
        may hold KV rows in the running batch. A queued request's first sample takes its other
        samples along; a further sample leaves its request's forks."""
        if request_id not in self._ids:
            return False
        self._ids.discard(request_id)
        waiting = [*self._queue, *([self._partial.row] if self._partial is not None else [])]
        for row in waiting:
            if row.request.request_id == request_id:
                self._ids.difference_update(row.ids)
                if self._partial is not None and row is self._partial.row:
                    self._partial = None
                else:
                    self._queue.remove(row)
                return False
            if request_id in row.ids:
                row.forks = [fork for fork in row.forks if fork[1] != request_id]
                if row.beam is not None:
                    release_beam(row.beam, request_id)
                return False
        return True

    def release(self, request_id: int) -> None:
        """Forget a request or one sample of it (finished or cancelled); its KV rows are gone
        before the next forward."""
        if not self._forget(request_id):
            return
        batch = self._batch
        if batch is None:
            return
        for row in batch.rows:
            if row.beam is not None and request_id in row.beam.ids:  # done once all its sequences are
                row.done = release_beam(row.beam, request_id) or row.done
            elif row.request.request_id == request_id:
                row.done = True
        if all(row.done for row in batch.rows):
            self._batch = None  # free the whole cache now

    def use_decode_graphs(self, mode: str, sizes: Sequence[int] | None = None) -> None:
        """Run decode steps on static shapes (``static``, ``cuda_graphs`` or ``compile``; see
        :mod:`.decode_graphs`), rows bucketed to ``sizes`` (None: vLLM's default sizes); their KV
        mirror counts against ``kv_cache_max_bytes`` (``_kv_fits``, ``_mirror_room``). Not with
        LoRA: per-row adapters are applied by hooks a captured graph would freeze."""
        if self.lora is not None:
            LOG.info("decode graphs: off with LoRA adapters (option.enable_lora)")
            return
        self.decode_graphs = DecodeGraphs(self.model, self._forward, mode, capture_sizes(self.max_batch_size, sizes),
                                          self.max_model_len)
        self.decode_graphs.mirror.ledger = self.slabs

    def load_adapter(self, spec: Any) -> None:
        """Register (and with ``preload`` load) a LoRA adapter; see :mod:`.lora`."""
        require_lora(self).load(spec)

    def unload_adapter(self, name: str) -> None:
        """Forget a LoRA adapter; running rows keep its weights until they finish."""
        if self.lora is not None:
            self.lora.unload(name)

    def has_unfinished(self) -> bool:
        """True while any request is queued, being prefilled or running."""
        return bool(self._ids)

    @property
    def running_ids(self) -> tuple[int, ...]:
        """Request ids in the running batch, in row order (released rows not yet compacted excluded)."""
        rows = self._batch.rows if self._batch is not None else []
        return tuple(r.request.request_id for r in rows if not r.done)

    @property
    def kv_shape(self) -> tuple[int, int]:
        """(rows, padded length) of the running batch's KV cache; (0, 0) when empty."""
        if self._batch is None:
            return (0, 0)
        return (int(self._batch.mask.shape[0]), int(self._batch.mask.shape[1]))

    def kv_cache_usage(self) -> dict[str, float]:
        """The running batch's KV slab: bytes holding real tokens, bytes allocated to its rows, and their
        ratio (0 with no batch); every live slab's capacity, spare rows and columns included
        (``kv_cache_capacity_bytes``: what the bound holds); with decode graphs, the bytes of their KV
        mirror (``kv_cache_mirror_bytes``, charged against the bound too). Read by the service for
        ``/metrics``; costs one mask sum."""
        figures: dict[str, Any] = self._kv_facts()
        figures["kv_cache_capacity_bytes"] = self.slabs.capacity()
        if self.slabs.over_bound:
            figures["kv_cache_over_bound_allocations"] = self.slabs.over_bound
        if self.decode_graphs is not None:
            figures["kv_cache_mirror_bytes"] = self.decode_graphs.mirror_bytes()
        if self._batch is None:
            return {"kv_cache_usage": 0.0, "kv_cache_used_bytes": 0, "kv_cache_allocated_bytes": 0, **figures}
        used, allocated = self._batch.kv_bytes()
        return {"kv_cache_usage": used / allocated if allocated else 0.0,
                "kv_cache_used_bytes": used, "kv_cache_allocated_bytes": allocated, **figures}

    def _kv_facts(self) -> dict[str, Any]:
        """What does not change while serving: bytes per cached token, the bound, the CPU patches."""
        facts: dict[str, Any] = {"kv_bytes_per_token": self.kv_bytes_per_token}
        if self.kv_dtype is not None:  # option.kv_cache_dtype other than the model's
            facts["kv_cache_dtype"] = str(self.kv_dtype).removeprefix("torch.")
        if self.kv_cache_max_bytes is not None:
            facts["kv_cache_max_bytes"] = self.kv_cache_max_bytes
        if self.cpu_patches:
            facts["cpu_patches"] = self.cpu_patches
        return facts

    def prefix_cache_stats(self) -> dict[str, int]:
        """The prefix cache's counters and size (empty when it is off); read by the service for
        ``/metrics`` next to :meth:`kv_cache_usage`."""
        return self.prefix_cache.stats() if self.prefix_cache is not None else {}

    def open_session(self, session: str, expires: float) -> None:
        """A stateful session opened (sessions/gate.py): its requests pin their prefix-cache blocks."""
        if self.prefix_cache is not None:
            self.prefix_cache.open_session(session, expires)

    def close_session(self, session: str) -> None:
        """A stateful session closed or expired: its prefix-cache pins are released."""
        if self.prefix_cache is not None:
            self.prefix_cache.close_session(session)

    def spec_decode_stats(self) -> dict[str, Any]:
        """Speculative decoding's counters (empty when it is off); read by the service for ``/metrics``."""
        return self.speculator.stats() if self.speculator is not None else {}

    def generate_static(self, requests: Sequence[EngineRequest]) -> list[list[StepOutput]]:
        """Dynamic-batch mode: ``model.generate()`` on left-padded batches (see :mod:`.static`)."""
        return static_generate(self, requests)

    # ------------------------------------------------------------------ internals
    def _check_cache_layout(self) -> None:
        if not uses_plain_layers(self.model.config):
            raise ConfigError(
                "continuous batching supports full-attention decoder models only "
                f"({type(self.model).__name__} uses sliding-window or other cache layers); "
                "use dynamic batching (option.rolling_batch=disable)"
            )

    def use_kv_dtype(self, dtype: torch.dtype | None) -> None:
        """Store the KV cache in ``dtype`` from now on (None: the model's own; see
        :mod:`djl_handlers.engines.hf.kv_dtype`, which says where another one applies)."""
        self.kv_dtype = dtype
        self.kv_bytes_per_token = bytes_per_token(self.model, dtype)
        if dtype is not None:
            LOG.info("KV cache in %s under the model's %s (option.kv_cache_dtype): %d bytes per token",
                     str(dtype).removeprefix("torch."), str(self.model.dtype).removeprefix("torch."),
                     self.kv_bytes_per_token)

    def new_cache(self, ledger: SlabLedger | None = None) -> Any:
        """An empty slab cache of the KV cache's type: within ``ledger`` (the running batch's; None
        for a ``generate()`` call of the dynamic batch)."""
        return new_slab_cache(self.model.config, ledger, self.kv_dtype)

    def _new_cache(self) -> Any:
        return self.new_cache(self.slabs)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any,
                 embeds: torch.Tensor | None = None) -> torch.Tensor:
        """One forward; returns last-position logits [batch, vocab] (float32)."""
        return self._forward_tail(ids, mask, pos, cache, 1, embeds)[:, -1, :]

    def _forward_tail(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any,
                      keep: int, embeds: torch.Tensor | None = None) -> torch.Tensor:
        """One forward; the logits of the last ``keep`` positions [batch, keep, vocab] (float32).
        ``embeds``: the input embeddings to use instead of ``ids``' (a prompt with images)."""
        kwargs: dict[str, Any] = {self._cache_kw: cache, "use_cache": True}
        if self._keep_kw:
            kwargs[self._keep_kw] = keep
        if embeds is not None:
            kwargs["inputs_embeds"] = embeds
        else:
            kwargs["input_ids"] = ids
        out = self.model(attention_mask=mask, position_ids=pos, **kwargs)
        return out.logits[:, -keep:, :].float()

    def _forward_capturing(
        self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any,
        embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``_forward`` plus the final hidden states, for prompt log-probs (see :mod:`.prefill`)."""
        return forward_capturing(self.model, lambda: self._forward(ids, mask, pos, cache, embeds))

    def _embeds(self, ids: torch.Tensor, rows: Sequence[Row], starts: Sequence[int],
                lengths: Sequence[int]) -> torch.Tensor | None:
        """The input embeddings of a prefill whose rows have images (None when none has): the
        text embeddings with each row's image features at its image tokens (:mod:`.vision`)."""
        if self.vision is None or not any(r.images is not None for r in rows):
            return None
        spans = zip(rows, starts, lengths, strict=True)
        with_images = [(b, r.images, start, n) for b, (r, start, n) in enumerate(spans) if r.images is not None]
        return self.vision.embed(ids, with_images)

    def _prompt_lps(
        self, hidden: torch.Tensor | None, row: int, start: int, stop: int, targets: Sequence[int],
        prefix: list[float | None], top_n: int = 0,
    ) -> list[float | None]:
        return prompt_lps(self.model, hidden, row, start, stop, targets, prefix, top_n)

    def _compact(self) -> list[StepOutput]:
        """Drop done rows and the common left padding; fail rows that cannot grow any more."""
        batch = self._batch
        if batch is None:
            return []
        errors: list[StepOutput] = []
        full = (batch.pos + 2 > self.max_model_len).nonzero().flatten().tolist()
        for i in full:
            row = batch.rows[i]
            if not row.done:
                row.done = True
                self._ids.discard(row.request.request_id)
                errors.append(
                    StepOutput(
                        row.request.request_id,
                        error=f"the request reached the model's context length ({self.max_model_len} tokens)",
                    )
                )
        keep = [i for i, row in enumerate(batch.rows) if not row.done]
        if not keep:
            self._batch = None
        else:
            batch.select(keep)
        return errors

    def _decode(self) -> list[StepOutput]:
        batch = self._batch
        if batch is None:
            return []
        if self.speculator is not None:
            verified = self.speculator.decode(self, batch)
            if verified is not None:
                return verified
        batch.grow_mask()
        use_rows(self.lora, batch.rows)
        graphs = self.decode_graphs
        logits = graphs.decode(batch, self._mirror_room()) if graphs is not None else None  # None: dynamic shapes
        if logits is None:
            logits = self._forward(batch.pending.unsqueeze(1), batch.mask, batch.pos.unsqueeze(1), batch.cache)
        batch.pos = batch.pos + 1
        return self._emit(logits, batch.rows, batch)

    def _emit(
        self,
        logits: torch.Tensor,
        rows: list[Row],
        batch: KVBatch | None,
        prompt_lps: list[list[float | None] | None] | None = None,
    ) -> list[StepOutput]:
        """Sample one token per row, store it as pending (if ``batch``), build the outputs
        (with ``prompt_lps[i]`` and top tokens for the rows that asked for them)."""
        if any(row.beam is not None for row in rows):
            return self._emit_beams(logits, rows, batch, prompt_lps)
        top_n = [row.top_n for row in rows] if any(row.top_n for row in rows) else None
        grammars = [row.grammar for row in rows]
        ended = [False] * len(rows)
        if any(g is not None for g in grammars):
            from djl_handlers.engines.hf.grammar import constrained_sample

            result, ended = constrained_sample(logits, [row.sampling for row in rows], grammars, top_n)
        else:
            result = sample_batch(logits, [row.sampling for row in rows], top_n)
        tops = result.top_tokens
        if self.speculator is not None:
            self.speculator.observe(rows, result.tokens)
        if batch is not None:
            batch.pending = torch.tensor(result.tokens, dtype=torch.long, device=self.device).clamp(min=0)
        outputs = []
        for i, (row, tok, lp, err) in enumerate(
            zip(rows, result.tokens, result.log_probs, result.errors, strict=True)
        ):
            rid = row.request.request_id
            if err is not None:
                row.done = True
                self._ids.discard(rid)
                outputs.append(StepOutput(rid, error=err))
            else:
                prompt = prompt_lps[i] if prompt_lps is not None else None
                top = tops[i] if tops is not None else None
                reason = "eos_token" if ended[i] else None  # the grammar is complete
                outputs.append(StepOutput(rid, token_id=tok, log_prob=lp, prompt_logprobs=prompt, top_tokens=top,
                                          finish_reason=reason, prompt_top_tokens=getattr(prompt, "top", None)))
        return outputs

    def _emit_beams(
        self, logits: torch.Tensor, rows: list[Row], batch: KVBatch | None, prompt_lps: PromptLps
    ) -> list[StepOutput]:
        """``_emit`` for a step with beam rows: the other rows as usual, then each beam request's step
        (:func:`.beam_rows.advance_beams`: its beams' KV rows copied within ``batch``)."""
        others = [i for i, row in enumerate(rows) if row.beam is None]
        pending = [0] * len(rows)
        outputs: list[StepOutput] = []
        if others:
            lps = [prompt_lps[i] for i in others] if prompt_lps is not None else None
            outputs = self._emit(logits[others], [rows[i] for i in others], None, lps)
            for i, out in zip(others, outputs, strict=True):
                pending[i] = max(out.token_id, 0)
        outputs += advance_beams(logits, rows, batch, pending, prompt_lps)
        for out in outputs:
            if out.error is not None:
                self._ids.discard(out.request_id)
        if batch is not None:
            batch.pending = torch.tensor(pending, dtype=torch.long, device=self.device)
        return outputs

    def _prefill(self) -> list[StepOutput]:
        """Continue a chunked prompt, then prefill queued prompts as :mod:`.planner` admits them."""
        budget = self.max_prefill_tokens
        outputs: list[StepOutput] = []
        if self._partial is not None:
            outputs, budget = self._continue_partial(budget)
        outputs += self._start_grammars()
        while self._queue and budget > 0 and self._partial is None:
            if self._start_cached():  # the first ready prompt's first blocks are cached
                more, budget = self._continue_partial(budget)
                outputs += more
                continue
            head = first_ready(self._queue)
            if head is not None and len(head.request.prompt_ids) > self.max_prefill_tokens:
                # only chunked prefill can take it: it starts on a full budget, nobody overtakes it
                if starts_chunked(head, budget, self.max_prefill_tokens, self._room(), self._admits):
                    self._queue.remove(head)
                    self._count_cached(head, 0)
                    self._partial = Partial(head, self._new_cache())
                    more, budget = self._continue_partial(budget)
                    outputs += more
                break
            cache = self.prefix_cache  # prompts with cached blocks wait to start from them (above)
            misses = [r for r in self._queue if cache is None or not cache.cached_blocks(r)]
            group = take_group(misses, budget, self._room(), self._admits)
            if not group:
                break
            for row in group:
                self._queue.remove(row)
            budget -= len(group) * max(len(r.request.prompt_ids) for r in group)
            outputs += self._prefill_group(group)
        return outputs

    def _start_cached(self) -> bool:
        """Start the first ready prompt as a chunked prefill from its cached blocks, when the prefix
        cache holds some and it may join now; True when it did."""
        cache, head = self.prefix_cache, first_ready(self._queue)
        if cache is None or head is None:
            return False
        blocks = cache.cached_blocks(head)
        if not blocks or self._room() < head.width or not self._admits(head, ()):
            return False
        self._queue.remove(head)
        self._count_cached(head, blocks)
        offset = blocks * cache.block
        self._partial = Partial(head, cache.load(head, blocks, self._new_cache()), offset=offset)
        if head.images is not None and self.vision is not None:  # the cached blocks hold these image tokens
            head.images.used = sum(1 for t in head.request.prompt_ids[:offset] if t == self.vision.image_token_id)
        return True

    def _count_cached(self, row: Row, blocks: int) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.admitted(row, blocks)

    def _room(self) -> int:
        running = len(self._batch.rows) if self._batch is not None else 0
        return self.max_batch_size - running - (self._partial.row.width if self._partial is not None else 0)

    def _admits(self, row: Row, taken: Sequence[Row]) -> bool:
        return admits_row(self, row, taken) and self._kv_fits([*taken, row])

    def _held(self) -> list[Row]:
        """The rows that hold KV now: the running batch's and the chunk-prefilled one."""
        return [*(self._batch.rows if self._batch is not None else ()),
                *([self._partial.row] if self._partial is not None else ())]

    def _kv_fits(self, prefill: Sequence[Row]) -> bool:
        """Whether the running rows plus ``prefill`` stay within the KV bound at their worst case,
        beside the decode graphs' mirror. A mirror larger than the running rows' next step needs (a
        past batch's, or none running) gives way to a request that fits without it."""
        if self.kv_cache_max_bytes is None:
            return True
        cache = footprint(self._held(), prefill, self.max_model_len) * self.kv_bytes_per_token
        graphs = self.decode_graphs
        mirror = graphs.mirror_bytes() if graphs is not None else 0
        if cache + mirror <= self.kv_cache_max_bytes:
            return True
        if graphs is None or not mirror or cache > self.kv_cache_max_bytes or mirror <= graphs.need_bytes(self._batch):
            return False
        graphs.yield_room()
        return True

    def _mirror_room(self) -> int | None:
        """The bytes the decode graphs' mirror may take this step: what the KV bound leaves beside
        the running rows' reserved cache, a chunk-prefilled prompt's own cache included as at its
        admission (None: no bound)."""
        if self.kv_cache_max_bytes is None:
            return None
        running = self._batch.rows if self._batch is not None else []
        chunked = [self._partial.row] if self._partial is not None else []
        return self.kv_cache_max_bytes - footprint(running, chunked, self.max_model_len) * self.kv_bytes_per_token

    def _check_kv_room(self, request: EngineRequest) -> None:
        """Refuse (507) a request whose worst case alone exceeds the KV bound: it could never run."""
        if self.kv_cache_max_bytes is None:
            return
        rows = max(1 + len(request.sample_ids), int(request.params.num_beams))
        final = min(len(request.prompt_ids) + int(request.params.max_new_tokens), self.max_model_len)
        need = rows * (final + len(request.prompt_ids)) * self.kv_bytes_per_token
        if need > self.kv_cache_max_bytes:
            raise EngineOutOfMemory(
                f"the request needs up to {need} bytes of KV cache ({rows} row(s) of up to {final} tokens at "
                f"{self.kv_bytes_per_token} bytes per token, plus its prefill) but option.kv_cache_memory_bytes "
                f"allows {self.kv_cache_max_bytes}; lower max_new_tokens or the prompt, or raise the bound")

    def grammar_backend(self) -> GrammarBackend:
        if self._grammars is None:
            from djl_handlers.engines.hf.grammar import GrammarBackend

            self._grammars = GrammarBackend(self.tokenizer, self._vocab, sorted(self.eos_token_ids))
        return self._grammars

    def _start_grammars(self) -> list[StepOutput]:
        """Queued rows whose grammar is compiled get their matcher; a failed compile fails its row."""
        if self._grammars is None:
            return []
        from djl_handlers.engines.hf.grammar import start_matchers

        idle = self._batch is None and self._partial is None
        outputs: list[StepOutput] = []
        for row, message in start_matchers(self._queue, self._grammars, idle):
            self._queue.remove(row)
            outputs += self._fail_rows([row], message)
        return outputs

    def _prefill_group(self, group: list[Row]) -> list[StepOutput]:
        """Prefill ``group`` as one left-padded batch and merge it. A failure of the forward (bad
        input, out of memory) fails these requests only; the running batch is untouched."""
        lengths = [len(r.request.prompt_ids) for r in group]
        try:
            ids, mask = left_pad([r.request.prompt_ids for r in group], 0)
            ids, mask = ids.to(self.device), mask.to(self.device)
            pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
            cache = self._new_cache()
            use_rows(self.lora, group)
            width = int(ids.shape[1])
            embeds = self._embeds(ids, group, [width - n for n in lengths], lengths)
            prompt_lps = None
            if any(r.prompt_lp for r in group):
                logits, hidden = self._forward_capturing(ids, mask, pos, cache, embeds)
                width = ids.shape[1]
                prompt_lps = [
                    self._prompt_lps(hidden, i, width - n, width - 1, r.request.prompt_ids[1:], [None], r.top_n)
                    if r.prompt_lp else None
                    for i, (r, n) in enumerate(zip(group, lengths, strict=True))
                ]
            else:
                logits = self._forward(ids, mask, pos, cache, embeds)
        except Exception as exc:  # noqa: BLE001 - isolate the group
            LOG.exception("prefill of %d request(s) failed", len(group))
            return self._fail_rows(group, f"prefill failed: {type(exc).__name__}: {exc}")
        if self.prefix_cache is not None:
            width = int(ids.shape[1])
            for i, (row, n) in enumerate(zip(group, lengths, strict=True)):
                self.prefix_cache.admitted(row, 0)
                self.prefix_cache.store(row, prompt_kv(cache.layers, i, width - n, width))
        new = KVBatch(cache, mask, torch.tensor(lengths, dtype=torch.long, device=self.device), ids[:, 0])
        new.rows = list(group)
        logits, prompt_lps = fan_out(new, logits, prompt_lps, self._fork_rows)
        outputs = self._emit(logits, new.rows, new, prompt_lps)
        self._merge(new)
        return outputs

    def _fork_rows(self, row: Row) -> list[Row]:
        return fork_rows(row, self.name, self._vocab, self.eos_token_ids)

    def _fail_rows(self, rows: list[Row], message: str) -> list[StepOutput]:
        """Fail ``rows`` (queued or just prefilled), each sample of them by its own id."""
        for row in rows:
            row.done = True
            self._ids.difference_update(row.ids)
        return [StepOutput(rid, error=message) for row in rows for rid in row.ids]

    def _continue_partial(self, budget: int) -> tuple[list[StepOutput], int]:
        part = self._partial
        assert part is not None
        prompt = part.row.request.prompt_ids
        chunk = list(prompt[part.offset : part.offset + budget])
        end = part.offset + len(chunk)
        ids = torch.tensor([chunk], dtype=torch.long, device=self.device)
        mask = torch.ones((1, end), dtype=torch.long, device=self.device)
        pos = torch.arange(part.offset, end, device=self.device).unsqueeze(0)
        use_rows(self.lora, [part.row])
        try:
            embeds = self._embeds(ids, [part.row], [0], [len(chunk)])
            if part.row.prompt_lp:
                logits, hidden = self._forward_capturing(ids, mask, pos, part.cache, embeds)
                # position j predicts token j + 1: the chunk's last position predicts the next
                # chunk's first token, or (last chunk) is the first generated token's logits.
                targets = prompt[part.offset + 1 : end + 1]
                part.prompt_lps = self._prompt_lps(hidden, 0, 0, len(targets), targets, part.prompt_lps or [None],
                                                   part.row.top_n)
            else:
                logits = self._forward(ids, mask, pos, part.cache, embeds)
        except Exception as exc:  # noqa: BLE001 - isolate this request
            LOG.exception("chunked prefill of request %s failed", part.row.request.request_id)
            self._partial = None
            return self._fail_rows([part.row], f"prefill failed: {type(exc).__name__}: {exc}"), 0
        part.offset = end
        if end < len(prompt):
            return [], budget - len(chunk)
        self._partial = None
        if self.prefix_cache is not None:
            self.prefix_cache.store(part.row, prompt_kv(part.cache.layers, 0, 0, end))
        new = KVBatch(part.cache, mask, torch.tensor([end], device=self.device), ids[:, 0], [part.row])
        logits, lps = fan_out(new, logits, [part.prompt_lps] if part.row.prompt_lp else None, self._fork_rows)
        outputs = self._emit(logits, new.rows, new, lps)
        self._merge(new)
        return outputs, budget - len(chunk)

    def _merge(self, new: KVBatch) -> None:
        """Append ``new``'s rows (minus any that failed sampling) to the running batch."""
        keep = [i for i, row in enumerate(new.rows) if not row.done]
        if not keep:
            return
        new.select(keep)
        if self._batch is None:
            self._batch = new
        else:
            self._batch.merge(new)

    def _drop_running(self) -> None:
        """After a failed step nothing in the running batch can be trusted: forget it (queued
        requests stay queued)."""
        self._batch = None
        self._partial = None
        self._ids = {rid for row in self._queue for rid in row.ids}


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """eos ids from the generation config (int or list) and the tokenizer."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return frozenset(ids)


def step_limits(config: ServingConfig) -> dict[str, Any]:
    """The engine's constructor limits from ``config``: batch rows, prefill budget, context length."""
    return {"max_batch_size": config.max_rolling_batch_size,
            "max_prefill_tokens": config.hf.max_prefill_tokens or DEFAULT_PREFILL_TOKENS,
            "max_model_len": config.max_model_len}
