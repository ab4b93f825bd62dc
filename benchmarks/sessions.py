"""``python -m benchmarks.sessions``: a six-turn chat in a stateful session against the same turns
without one, on a shared server whose prefix cache is bounded.

Two HF handlers on the embedded SmolLM2 in DJL's async mode, identical (``option.enable_prefix_caching``,
``option.enable_stateful_sessions``, ``option.prefix_cache_memory_bytes`` set to ``--cache-mb``): one
serves the conversation in a session (``X-Amzn-SageMaker-Session-Id``), the other the same turns
without the header. After every turn each handler serves the same unrelated requests (``--others``
readers pasting a document), the traffic of a shared server, which overflows the cache's bound. Which handler
goes first alternates by turn. Per turn: prompt tokens, the tokens served from the cache and the time
to first token (TTFT, until the first streamed record) of each, and their ratio; whether the answers
are identical. Results: ``benchmarks/results/sessions.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from typing import Any, Optional

from benchmarks.common import context, print_table, rnd, setup_torch, write_report
from benchmarks.prefix_cache import DOCUMENT, QUESTIONS, _messages

HEADER = "X-Amzn-SageMaker-Session-Id"


async def _handler(model_dir: str, dtype: str, cache_bytes: int, root: str) -> tuple[Any, Any]:
    from djl_handlers.service import InferenceService
    from djl_handlers.testing.async_loop import AsyncModeClient

    service = InferenceService("huggingface")
    client = AsyncModeClient(service.handle)
    await client.init({"model_id": model_dir, "dtype": dtype, "rolling_batch": "disable",
                       "enable_prefix_caching": "true", "prefix_cache_memory_bytes": str(cache_bytes),
                       "enable_stateful_sessions": "true", "sessions_path": root})
    return service, client


async def _turn(service: Any, client: Any, prompt: str, new_tokens: int, headers: dict[str, str]) -> dict[str, Any]:
    """One streamed request alone: TTFT (until its first record with data) and the answer."""
    from djl_handlers.testing.async_loop import AsyncAnswer

    before = service.engine_stats(0).get("prefix_cache_hits", 0)
    answer = AsyncAnswer()
    body = {"inputs": prompt, "stream": True,
            "parameters": {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens}}
    started = time.perf_counter()
    task = asyncio.ensure_future(client.stream(body, answer, **headers))
    while not answer.chunks and not task.done():
        await asyncio.sleep(0.002)
    ttft = time.perf_counter() - started
    await task
    assert answer.code == 200, answer.text
    text = "".join(answer.chunks)
    return {"ttft_s": ttft, "text": text, "cached": service.engine_stats(0).get("prefix_cache_hits", 0) - before}


async def run_benchmark(turns: int, new_tokens: int, dtype: str, cache_mb: int, others: int) -> dict[str, Any]:
    from djl_handlers.model.embedded import embedded_model_dir

    model_dir = str(embedded_model_dir())
    with tempfile.TemporaryDirectory() as root:
        handlers = {name: await _handler(model_dir, dtype, cache_mb << 20, f"{root}/{name}") for name in ("on", "off")}
        created = await handlers["on"][1].request({"requestType": "NEW_SESSION"})
        headers = {"on": {HEADER: created.headers[HEADER].split(";")[0]}, "off": {}}
        tokenizer = handlers["off"][0].engine.tokenizer
        rows: list[dict[str, Any]] = []
        answers: list[str] = []
        identical = True
        try:
            for turn in range(turns):
                prompt = tokenizer.apply_chat_template(_messages(turn, answers), tokenize=False,
                                                       add_generation_prompt=True)
                traffic = [tokenizer.apply_chat_template(
                    [{"role": "user", "content": f"Reader {turn}.{n} pasted this:\n\n{DOCUMENT}\n\nSummarise it."}],
                    tokenize=False, add_generation_prompt=True) for n in range(others)]
                order = ["on", "off"] if turn % 2 == 0 else ["off", "on"]
                got = {}
                for name in order:
                    service, client = handlers[name]
                    got[name] = await _turn(service, client, prompt, new_tokens, headers[name])
                    for other in traffic:  # the shared server's other traffic
                        await _turn(service, client, other, 1, {})
                identical = identical and got["on"]["text"] == got["off"]["text"]
                answers.append(_reply(got["off"]["text"]))
                on, off = got["on"]["ttft_s"], got["off"]["ttft_s"]
                rows.append({"turn": turn + 1, "prompt_tokens": len(tokenizer.encode(prompt)),
                             "cached_session": got["on"]["cached"], "cached_plain": got["off"]["cached"],
                             "ttft_session_ms": rnd(on * 1000, 1), "ttft_plain_ms": rnd(off * 1000, 1),
                             "ttft_ratio": rnd(on / off, 3)})
        finally:
            for service, _ in handlers.values():
                service.async_mode.close()
    later = [r["ttft_ratio"] for r in rows[1:]]
    return {"turns": turns, "new_tokens": new_tokens, "dtype": dtype, "cache_mb": cache_mb, "others": others,
            "rows": rows,
            "identical_answers": identical, "ttft_ratio_max_turns_2_on": max(later) if later else None}


def _reply(stream_text: str) -> str:
    """The generated text of a jsonlines stream (its last line's ``generated_text``)."""
    import json

    lines = [json.loads(line) for line in stream_text.splitlines() if line.strip()]
    return str(lines[-1].get("generated_text") or "")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sessions", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 turns")
    parser.add_argument("--turns", type=int, default=len(QUESTIONS))
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens generated per turn")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--cache-mb", type=int, default=48, help="option.prefix_cache_memory_bytes, in MiB")
    parser.add_argument("--others", type=int, default=2, help="unrelated requests after each turn")
    args = parser.parse_args(argv)
    setup_torch()
    started = context()
    turns = 3 if args.quick else min(args.turns, len(QUESTIONS))
    report = asyncio.run(run_benchmark(turns, args.new_tokens, args.dtype, args.cache_mb, args.others))
    print_table(report["rows"], ["turn", "prompt_tokens", "cached_session", "cached_plain", "ttft_session_ms",
                                 "ttft_plain_ms", "ttft_ratio"], f"stateful session vs none ({args.dtype})")
    print("identical answers:", report["identical_answers"], "max TTFT ratio, turns 2+:",
          report["ttft_ratio_max_turns_2_on"])
    write_report("sessions", report, args.quick, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
