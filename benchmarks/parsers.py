"""Cost of the reply parsers per streamed token: the OpenAI chat stream read by the parsers
(``chat_tools_sse`` with ``deepseek_r1`` + ``hermes``, and with ``pythonic``) against the plain chat
stream (``chat_sse``) of the same reply, formatted for 32 concurrent streams step by step as the
scheduler calls the formatters, side by side in one run; and one decode step of the HF engine at 32
rows (the embedded SmolLM2, fp32) to set the cost against (goal: the parsers' extra cost per step at
32 streams within 2 % of a decode step).

``python -m benchmarks.parsers [--quick]`` prints the table and writes
``benchmarks/results/parsers[-quick].json``. The reply is tokenized by the embedded model's
tokenizer (real token boundaries): a reasoning paragraph, ``</think>``, a sentence and two
``<tool_call>`` blocks. Times are the best of a few repetitions (shared 2-core box; the load
average is recorded with the CPU's name).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.common import context, print_table, rnd, setup_torch, write_report

STREAMS = 32
REASONING = ("The user wants the weather in Paris and the local time there. I should call the weather "
             "tool with the city and the number of days, then the time tool with the Paris time zone. "
             "Both calls are independent, so I can make them in parallel and answer once both return. ")
CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "unit": "celsius"}}\n'
         '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}\n</tool_call>')
PYTHONIC = '[get_weather(city="Paris", days=3, unit="celsius"), get_time(zone="Europe/Paris")]'
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
         for n in ("get_weather", "get_time")]


def token_texts(tokenizer: Any, text: str) -> list[str]:
    """``text`` cut where the tokenizer cuts it, as an incremental detokenizer releases it."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    out, sent = [], ""
    for i in range(len(ids)):
        now = tokenizer.decode(ids[: i + 1])
        if now.endswith("\ufffd") and i + 1 < len(ids):
            continue
        out.append(now[len(sent):])
        sent = now
    return out


def stream_cost(pieces: list[str], formatter: str, reasoning: str, parser: str, repeats: int) -> float:
    """Seconds to format ``pieces`` for ``STREAMS`` streams, best of ``repeats``."""
    from djl_handlers.dialects.registry import get_formatter
    from djl_handlers.params.generation import GenerationParameters
    from djl_handlers.request.records import Request, RequestOutput, ResponseOptions, Token, ToolPlan

    best = float("inf")
    for _ in range(repeats):
        fmt = get_formatter(formatter, stream=True)
        plan = ToolPlan(TOOLS, mode="auto", parser=parser) if parser else None
        options = ResponseOptions("m", reasoning_parser=reasoning)
        outs = [RequestOutput(request=Request(prompt="p", params=GenerationParameters(), tools=plan,
                                              response_options=options), prompt_tokens=40) for _ in range(STREAMS)]
        started = time.perf_counter()
        for i, text in enumerate(pieces):
            last = i == len(pieces) - 1
            for out in outs:
                token = Token(i, text, -0.5)
                out.tokens.append(token)
                out.new_tokens = [token]
                if last:
                    out.finished, out.finish_reason = True, "eos_token"
                fmt(out)
        best = min(best, time.perf_counter() - started)
    return best


def decode_step_s(tokens: int) -> float:
    """Seconds per decode step of the HF engine with ``STREAMS`` rows (prefill excluded)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.model.embedded import embedded_model_dir
    from djl_handlers.params.generation import GenerationParameters

    path = str(embedded_model_dir())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = HFEngine(model, tok, max_batch_size=STREAMS)
    prompt = tok.encode("<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    params = GenerationParameters.from_dict({"max_new_tokens": tokens, "ignore_eos_token": True})
    for i in range(STREAMS):
        engine.add_request(EngineRequest(i, prompt, params))
    counts = dict.fromkeys(range(STREAMS), 0)

    def step() -> None:
        for out in engine.step():
            counts[out.request_id] += 1
            if out.finish_reason or out.error or counts[out.request_id] >= tokens:
                engine.release(out.request_id)  # the scheduler's stopping rule, here by count

    step()  # the prefill
    steps, started = 0, time.perf_counter()
    while engine.has_unfinished():
        step()
        steps += 1
    return (time.perf_counter() - started) / max(steps, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and decode steps")
    args = parser.parse_args()
    setup_torch()
    started = context()
    from transformers import AutoTokenizer

    from djl_handlers.model.embedded import embedded_model_dir

    tok = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    repeats = 2 if args.quick else 5
    hermes = token_texts(tok, REASONING + "</think>Let me check both." + CALLS)
    pythonic = token_texts(tok, PYTHONIC)
    cases = [("reasoning + hermes", hermes, "deepseek_r1", "hermes"), ("pythonic", pythonic, "", "pythonic")]
    step = decode_step_s(8 if args.quick else 24)
    rows = []
    for name, pieces, reasoning, tools in cases:
        plain = stream_cost(pieces, "chat_sse", "", "", repeats)
        parsed = stream_cost(pieces, "chat_tools_sse", reasoning, tools, repeats)
        per_token = (parsed - plain) / (STREAMS * len(pieces))  # seconds per token per stream
        calls = STREAMS * len(pieces)
        rows.append({"reply": name, "tokens": len(pieces), "plain_us_per_token": rnd(plain / calls * 1e6),
                     "parsed_us_per_token": rnd(parsed / calls * 1e6),
                     "extra_us_per_token": rnd(per_token * 1e6),
                     "extra_per_step_32_streams_ms": rnd(per_token * STREAMS * 1e3, 3),
                     "share_of_decode_step_pct": rnd(per_token * STREAMS / step * 100, 2)})
    print(f"decode step, HF engine, {STREAMS} rows, embedded SmolLM2 fp32: {step * 1e3:.1f} ms")
    print_table(rows, list(rows[0]), f"reply parsers, {STREAMS} streams")
    path = write_report("parsers", {"decode_step_ms": rnd(step * 1e3, 2), "rows": rows}, args.quick, started)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
