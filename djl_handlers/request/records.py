"""Plain data records shared by the request parser, the scheduler and the formatters.

Nothing here imports an ML library. ``Token`` is one generated token; ``Request`` is one parsed
client request; ``RequestOutput`` is the growing result of a request that formatters turn into
bytes, one call per scheduler step. A request also carries what an API dialect's parser read for its
formatter (``ToolPlan``, ``ResponseOptions``) and the state that formatter keeps between its calls
(a ``FormatterState`` subclass the formatter defines).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:
    from djl_handlers.media.records import ImageRef, MediaInputs
    from djl_handlers.params.generation import GenerationParameters

FinishReason = str  # "length" | "eos_token" | "stop_sequence" | "error"


@dataclass(frozen=True)
class Token:
    """One generated token. ``log_prob`` is None when the engine does not report it."""

    id: int
    text: str
    log_prob: Optional[float] = None
    special: bool = False



# A custom output formatter function from model.py, called once per step with the request's output
# (``formatting.custom.CustomFormatter`` is the class that wraps it).
FormatterFunction = Callable[["RequestOutput"], str]


@dataclass
class ToolPlan:
    """What a request's tool fields ask for (OpenAI's ``tools``/``tool_choice``/``parallel_tool_calls``,
    validated by ``dialects.openai.tools``), and so how its reply is read back as tool calls.

    ``mode``: ``none`` (tools not shown, the reply is text), ``auto`` (the reply is a call when it is
    one), ``required`` (one or more calls, constrained by ``schema``) or ``named`` (a call of
    ``function``, its arguments constrained by ``schema``).
    """

    tools: list[dict[str, Any]] = field(default_factory=list)  # as the chat template gets them
    mode: str = "none"
    function: Optional[str] = None  # named mode
    parallel: bool = True
    schema: Optional[dict[str, Any]] = None  # guided_json for required/named
    parser: str = "json"  # the tool-call parser (parsers.registry) that reads auto replies

    @property
    def names(self) -> list[str]:
        """The names of the functions the reply may call."""
        return [t["function"]["name"] for t in self.tools]

    @property
    def may_call(self) -> bool:
        """True when the reply may be a tool call (some tool is shown and the mode is not ``none``)."""
        return self.mode != "none" and bool(self.tools)


@dataclass(frozen=True)
class ResponseOptions:
    """How a client shaped its response outside ``parameters`` (read from OpenAI bodies; other
    requests keep the defaults): ``model`` echoed (empty: the formatter's default), ``logprobs``
    (chat: bool; completions: the integer N, None when not asked), chat's ``top_logprobs``,
    ``stream_options.include_usage``, completions' ``echo`` (the prompt, and with ``logprobs`` its
    log-probs, before the completion) and ``prompt_only`` (``max_tokens`` 0 with ``echo``: the
    decoded token is not shown). Chat's ``reasoning_parser`` (parsers.registry; empty: replies are
    not split) and ``include_reasoning`` (false: the reasoning is read but not sent)."""

    model: str = ""
    logprobs: Union[bool, int, None] = None
    top_logprobs: int = 0
    include_usage: bool = False
    echo: bool = False
    prompt_only: bool = False
    reasoning_parser: str = ""
    include_reasoning: bool = True


class FormatterState:
    """Base of the per-request state a formatter keeps between its calls (a response id fixed on
    the first chunk, a parse done once); each formatter that needs one subclasses it."""


@dataclass
class Request:
    """One client request after parsing and validation.

    ``prompt`` is the text sent to the model (after chat templating, before truncation);
    ``inputs`` is what the client sent as ``inputs`` (reported in ``details.inputs``).
    ``output_formatter`` is a registered formatter name or a custom callable. ``seed`` is the
    seed the request samples with, resolved once by the parser (client's, else the front end's,
    else random; equal to ``params.seed``), and None for a greedy request.
    ``adapters``: the LoRA adapter of each prompt (None = base model); empty when none was named.
    ``tools``: the tool calls the reply may hold (None: it is text); ``response_options``: what the
    client set for its response outside ``parameters``; ``formatter_state``: owned by the request's
    formatter (None until its first call); ``legacy_id``: the ``id`` argument DJL v0.27's six-argument
    custom formatters receive. ``add_special_tokens``: whether tokenizing the prompt adds the
    tokenizer's special tokens (None: the tokenizer's default). ``prompt_ids``: the prompt as token
    ids when the client sent ids (OpenAI completions), used as they are (``prompt`` is then their
    text, decoded by the scheduler). ``per_prompt``: a request with several prompts (OpenAI
    completions with a list), one request per prompt in order, each answered as its own choice(s).
    """

    prompt: str
    params: GenerationParameters
    stream: bool = False
    output_formatter: Union[str, FormatterFunction, None] = None
    inputs: Any = None
    seed: Optional[int] = None
    properties: dict[str, str] = field(default_factory=dict)
    adapters: tuple[Optional[str], ...] = ()
    tools: Optional[ToolPlan] = None
    response_options: ResponseOptions = field(default_factory=ResponseOptions)
    formatter_state: Optional[FormatterState] = None
    legacy_id: int = 0
    add_special_tokens: Optional[bool] = None
    prompt_ids: Optional[tuple[int, ...]] = None
    per_prompt: tuple[Request, ...] = ()
    session: Optional[str] = None  # the LMI stateful session it is served in (async mode; sessions/)
    media: tuple[ImageRef, ...] = ()  # the images of a vision-language prompt, in prompt order (media/)
    # the processor's ids and the media for those images, once prepared (scheduling/media.py)
    encoded: Optional[tuple[list[int], MediaInputs]] = None

    def adapter_of(self, index: int = 0) -> Optional[str]:
        """The adapter of prompt ``index`` (None: the base model)."""
        return self.adapters[index] if index < len(self.adapters) else None


@dataclass
class RequestOutput:
    """The state of one request's generation, as formatters see it.

    ``tokens`` holds every token so far; ``new_tokens`` those added by the current step
    (empty on a step that produced nothing for this request).

    ``prefill`` (only with ``parameters.decoder_input_details``): one token per prompt token,
    ``log_prob`` = its log-probability given the tokens before it (None for the first).
    ``top_tokens`` (only with ``parameters.top_n_tokens``): one list per entry of ``tokens``,
    the N most likely tokens of that step's distribution, most likely first (empty when the
    engine reported none).
    ``prompt_top_tokens`` (only with both): per prompt token, the N most likely tokens at that
    position (None for the first).
    ``sequences`` (only for a request that decodes several samples, ``n``/``best_of`` > 1): each
    sample's own output, in sample order while decoding; once finished, when fewer are returned than
    decoded, ranked best first by cumulative log-probability (the response shows the first
    ``params.samples.returned_count``: ``request.sequences.returned``); this object's own ``tokens``
    then stay empty. A request with several prompts (``Request.per_prompt``) lists every choice
    here, prompt by prompt (each prompt's samples in sample order).
    """

    request: Request
    prompt_tokens: int = 0
    tokens: list[Token] = field(default_factory=list)
    new_tokens: list[Token] = field(default_factory=list)
    prefill: list[Token] = field(default_factory=list)
    top_tokens: list[list[Token]] = field(default_factory=list)
    prompt_top_tokens: list[Optional[list[Token]]] = field(default_factory=list)
    finished: bool = False
    finish_reason: Optional[FinishReason] = None
    error: Optional[str] = None
    error_code: Optional[int] = None
    error_field: Optional[str] = None  # the request field a refusal names (OpenAI's error ``param``)
    sequences: list[RequestOutput] = field(default_factory=list)

    @property
    def generated_text(self) -> str:
        """Text of all generated tokens (without any ``return_full_text`` prefix)."""
        return "".join(t.text for t in self.tokens)

    @property
    def full_text(self) -> str:
        """``generated_text`` with the prompt prefixed when ``return_full_text`` is set."""
        prefix = self.request.prompt if self.request.params.return_full_text else ""
        return prefix + self.generated_text
