"""Constrained decoding for the transformers/DeepSpeed engines, with xgrammar.

``GrammarBackend`` (one per engine) turns a request's ``StructuredOutput`` into an xgrammar
``CompiledGrammar``: a syntax check on the request path (``check``: no tokenizer needed, a few
milliseconds, so a bad schema/regex/grammar is a 400 with the compiler's message), then the
compilation against the vocabulary on a background thread (``submit``), cached per constraint
(LRU). ``RowGrammar`` is one request's matcher: before sampling it writes the row's allowed-token
bitmask, after sampling it advances with the chosen token. ``masked_logits`` applies the bitmasks
of the constrained rows of a batch to a copy of the logits; unconstrained rows are untouched.

Completion: once a grammar is complete the only allowed tokens are the model's eos tokens, so a
row ends with ``eos_token`` (``finish_reason`` ``stop`` in OpenAI terms) as soon as its output is
complete. A grammar can also end without an eos (``is_terminated`` after the last token); the
engine then reports ``eos_token`` itself.

xgrammar is imported lazily (``djl_handlers[hf]`` installs it); without it a constrained request
gets a 400 that says what to install, and unconstrained requests never touch this module's import.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Optional

import torch

from djl_handlers.errors import InvalidParameter
from djl_handlers.params.structured import StructuredOutput, choice_regex

LOG = logging.getLogger(__name__)
CACHE_SIZE = 256  # compiled grammars kept per engine
_LOCATION = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise InvalidParameter(
            "structured output on this engine needs the xgrammar package: pip install 'djl_handlers[hf]'",
            field="parameters",
        ) from None
    return xgrammar


def clean_message(exc: BaseException) -> str:
    """xgrammar's error text without its time stamp and C++ source location."""
    text = str(exc).strip()
    return _LOCATION.sub("", text.splitlines()[0] if text else type(exc).__name__)


def _json_options() -> dict[str, Any]:
    # No free whitespace between JSON tokens (separators ", " and ": "): with unbounded whitespace a
    # small model can emit newlines until max_new_tokens and never close the object.
    return {"any_whitespace": False}


_ANY_OBJECT = '{"type": "object"}'


class GrammarBackend:
    """Compiles and caches grammars for one tokenizer/vocabulary (see module docstring)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._compiler: Any = None
        self._cache: OrderedDict[StructuredOutput, Future[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None

    # -- request path ----------------------------------------------------------------------------
    def check(self, constraint: StructuredOutput) -> None:
        """Parse the constraint without the vocabulary; ``InvalidParameter`` naming the field and
        the compiler's message when it is not valid."""
        xgr = _xgrammar()
        try:
            if constraint.kind == "json":
                xgr.Grammar.from_json_schema(constraint.value, **_json_options())
            elif constraint.kind == "regex":
                xgr.Grammar.from_regex(constraint.value)
            elif constraint.kind == "grammar":
                xgr.Grammar.from_ebnf(constraint.value)
            elif constraint.kind == "choice":
                xgr.Grammar.from_regex(choice_regex(tuple(constraint.value or ())))
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError subclasses
            what = {"json": "JSON schema", "regex": "regular expression", "grammar": "EBNF grammar"}
            raise InvalidParameter(
                f"{constraint.describe()} is not a valid {what.get(constraint.kind, 'constraint')}: "
                f"{clean_message(exc)}",
                field=constraint.source or "parameters",
            ) from None

    def submit(self, constraint: StructuredOutput) -> Future[Any]:
        """The compiled grammar as a future: from the cache, or compiled on the background thread."""
        with self._lock:
            future = self._cache.get(constraint)
            if future is not None:
                self._cache.move_to_end(constraint)
                return future
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
            future = self._pool.submit(self.compile, constraint)
            self._cache[constraint] = future
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return future

    def compile(self, constraint: StructuredOutput) -> Any:
        """Compile ``constraint`` against the vocabulary (blocking)."""
        compiler = self._get_compiler()
        if constraint.kind == "json":
            return compiler.compile_json_schema(constraint.value, **_json_options())
        if constraint.kind == "json_object":  # any object, any properties (strict_mode off)
            return compiler.compile_json_schema(_ANY_OBJECT, strict_mode=False, **_json_options())
        if constraint.kind == "regex":
            return compiler.compile_regex(constraint.value)
        if constraint.kind == "choice":
            return compiler.compile_regex(choice_regex(tuple(constraint.value or ())))
        return compiler.compile_grammar(constraint.value)

    def matcher(self, compiled: Any) -> RowGrammar:
        """A fresh matcher for one request."""
        return RowGrammar(_xgrammar().GrammarMatcher(compiled), self._vocab_size)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _get_compiler(self) -> Any:
        if self._compiler is None:
            xgr = _xgrammar()
            info = xgr.TokenizerInfo.from_huggingface(
                self._tokenizer, vocab_size=self._vocab_size, stop_token_ids=self._eos or None
            )
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._compiler


class RowGrammar:
    """One request's grammar state: bitmask before sampling, advance after."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size
        self.failed: Optional[str] = None

    @property
    def terminated(self) -> bool:
        """True once the grammar has ended (its stop token accepted, or no further token allowed)."""
        return bool(self._matcher.is_terminated())

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write this row's allowed tokens into ``bitmask[row]``."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def fork(self) -> RowGrammar:
        """An independent matcher in this one's state (a further sample of the same prompt)."""
        return RowGrammar(self._matcher.fork(), self.vocab_size)

    def accept(self, token_id: int) -> bool:
        """Advance with the sampled token; False (and ``failed`` set) when the grammar rejects it."""
        if self._matcher.is_terminated():
            return True
        if not self._matcher.accept_token(int(token_id)):
            self.failed = f"token {token_id} does not continue the structured output"
            return False
        return True


def masked_logits(logits: torch.Tensor, grammars: Sequence[Optional[RowGrammar]]) -> torch.Tensor:
    """A copy of ``logits`` [rows, vocab] with every constrained row's disallowed tokens at -inf
    (``logits`` itself is returned when no row is constrained)."""
    rows = [i for i, g in enumerate(grammars) if g is not None and not g.terminated]
    if not rows:
        return logits
    xgr = _xgrammar()
    vocab = grammars[rows[0]].vocab_size  # type: ignore[union-attr]
    bitmask = xgr.allocate_token_bitmask(len(grammars), vocab)
    for i in rows:
        grammars[i].fill(bitmask, i)  # type: ignore[union-attr]
    out = logits.float().clone()
    backend = "cpu" if out.device.type == "cpu" else "auto"
    if out.shape[-1] == vocab:
        xgr.apply_token_bitmask_inplace(out, bitmask.to(out.device), indices=rows, backend=backend)
    else:  # the bitmask covers the tokenizer's vocabulary; other logits columns are never allowed
        width = min(vocab, out.shape[-1])
        head = out[:, :width].contiguous()
        xgr.apply_token_bitmask_inplace(
            head, bitmask.to(out.device), vocab_size=width, indices=rows, backend=backend
        )
        out[:, :width] = head
        out[rows, width:] = float("-inf")
    return out


def constrained_sample(
    logits: torch.Tensor,
    rows: Sequence[Any],
    grammars: Sequence[Optional[RowGrammar]],
    top_n: Optional[Sequence[int]] = None,
) -> tuple[Any, list[bool]]:
    """``sample_batch`` over the grammar-masked logits, then each constrained row's matcher
    advanced with its token. Returns the ``SampleResult`` and, per row, whether its grammar has
    terminated with this token. Log-probs and top tokens of constrained rows are those of the
    model's own distribution (the raw logits), as for unconstrained rows; a token the grammar
    rejects becomes that row's error."""
    from djl_handlers.engines.hf.sampling import log_normalizer, sample_batch, top_log_probs

    masked = masked_logits(logits, grammars)
    result = sample_batch(masked, rows, top_n)
    done = [False] * len(rows)
    if masked is logits:
        return result, done
    constrained = [i for i, g in enumerate(grammars) if g is not None]
    raw = logits.float()
    log_z = log_normalizer(raw[constrained]).tolist()  # the same log_z as unconstrained rows
    for j, i in enumerate(constrained):
        grammar = grammars[i]
        assert grammar is not None
        tok = result.tokens[i]
        if result.errors[i] is not None or tok < 0:
            continue
        result.log_probs[i] = float(raw[i, tok]) - log_z[j]
        if not grammar.accept(tok):
            result.errors[i] = grammar.failed
        done[i] = grammar.terminated
    if top_n is not None and result.top_tokens is not None:
        asking = [n if i in constrained else 0 for i, n in enumerate(top_n)]
        fixed = top_log_probs(raw, log_normalizer(raw), asking)
        result.top_tokens = [fixed[i] if i in constrained else t for i, t in enumerate(result.top_tokens)]
    return result, done


class GrammarLogitsProcessor:
    """A transformers logits processor for ``generate()`` (dynamic batching): row ``i`` of the
    batch follows ``grammars[i]``. The first call sees the prompts; each later call first
    advances every live matcher with the token just generated."""

    def __init__(self, grammars: Sequence[RowGrammar]) -> None:
        self.grammars = list(grammars)
        self._started = False

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._started:
            for grammar, token in zip(self.grammars, input_ids[:, -1].tolist(), strict=True):
                if not grammar.terminated and grammar.failed is None:
                    grammar.accept(token)
        self._started = True
        live: list[Optional[RowGrammar]] = [g if g.failed is None else None for g in self.grammars]
        return masked_logits(scores, live)


def start_matchers(rows: Sequence[Any], backend: GrammarBackend, idle: bool) -> list[tuple[Any, str]]:
    """For queued engine rows (``compiling``: a future or None; ``grammar``): a row whose grammar
    finished compiling gets its matcher and ``compiling = None``. Returns ``(row, message)`` for
    rows whose compilation failed. ``idle`` (nothing else to run): wait up to 50 ms for the first
    pending compile instead of letting the step loop spin."""
    pending = [row for row in rows if row.compiling is not None]
    if not pending:
        return []
    if idle and not any(row.compiling is None for row in rows):
        wait([pending[0].compiling], timeout=0.05)
    failed: list[tuple[Any, str]] = []
    for row in pending:
        if not row.compiling.done():
            continue
        future, row.compiling = row.compiling, None
        try:
            row.grammar = backend.matcher(future.result())
        except Exception as exc:  # noqa: BLE001 - this request's grammar only
            failed.append((row, f"the structured-output constraint could not be compiled: {clean_message(exc)}"))
    return failed
