"""``python -m benchmarks.prefix_cache``: prefix caching on a multi-turn chat, side by side.

One conversation (a system prompt, a pasted document and follow-up questions), each turn resending
the whole conversation through the chat template, as a chat client does. Two HF handlers on the
embedded SmolLM2 run every turn alternately, one with ``option.enable_prefix_caching=true`` and one
without, on the same prompt (the conversation is built from the uncached handler's answers). Per
turn: prompt tokens, the tokens served from the cache, time to first token (TTFT) of each handler
and their ratio; overall: generated tokens per second of each handler and whether their answers are
identical. Each round starts with an empty cache. Results: ``benchmarks/results/prefix_cache.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Optional

from benchmarks.common import context, median, print_table, rnd, setup_torch, write_report

SYSTEM = "You are a helpful assistant. Answer the user's questions about the document in a few sentences."
DOCUMENT = (
    "The history of computing spans from mechanical calculators to modern microprocessors. Early machines such "
    "as the difference engine were designed to tabulate polynomial functions. In the twentieth century, "
    "electromechanical relays gave way to vacuum tubes, then to transistors and integrated circuits. Each step "
    "made computers smaller, faster and cheaper. Programming moved from plugboards to assembly language and "
    "then to high-level languages such as Fortran, Lisp and C. Operating systems grew from simple batch "
    "monitors to time-sharing systems that let many users work at once. Networking connected machines across "
    "campuses and then across the world. Personal computers brought computing into homes and offices, and the "
    "web made information available to anyone with a browser. Mobile phones now carry more computing power "
    "than the machines that guided the first missions to the Moon. Machine learning, once a niche of "
    "statistics, now powers translation, search and recommendation systems. "
) * 3
QUESTIONS = [
    "Summarise the document in two sentences.",
    "What replaced vacuum tubes?",
    "Name three programming languages the document mentions.",
    "What did operating systems grow into?",
    "How does the document compare mobile phones with early space missions?",
    "What does machine learning power today?",
]


def _messages(turn: int, answers: list[str]) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": SYSTEM}]
    for i in range(turn + 1):
        question = QUESTIONS[i] if i else f"Here is a document:\n\n{DOCUMENT}\n\n{QUESTIONS[0]}"
        messages.append({"role": "user", "content": question})
        if i < turn:
            messages.append({"role": "assistant", "content": answers[i]})
    return messages


def _service(model_dir: str, dtype: str, cache: bool) -> Any:
    from djl_handlers.io import Input
    from djl_handlers.service import InferenceService

    service = InferenceService("huggingface")
    init = {"model_id": model_dir, "dtype": dtype, "rolling_batch": "auto",
            "enable_prefix_caching": str(cache).lower()}
    assert service.handle(Input.from_parts(init, ())) is None
    return service


def _turn(service: Any, prompt: str, new_tokens: int) -> dict[str, Any]:
    """One request alone: TTFT (until the step that writes its first token) and the whole answer."""
    from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

    before = service.engine_stats(0).get("prefix_cache_hits", 0)
    driver = RollingBatchDriver(service.handle)
    params = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens}
    body = {"inputs": prompt, "stream": True, "parameters": params}
    started = time.perf_counter()
    req = driver.submit(json_request(body))
    while not req.chunks:
        driver.step()
    ttft = time.perf_counter() - started
    driver.run()
    total = time.perf_counter() - started
    lines = [json.loads(line) for line in req.text.splitlines() if line.strip()]
    return {"ttft_s": ttft, "total_s": total, "tokens": len(lines), "text": lines[-1]["generated_text"],
            "cached": service.engine_stats(0).get("prefix_cache_hits", 0) - before}


def run_benchmark(quick: bool, rounds: int, turns: int, new_tokens: int, dtype: str) -> dict[str, Any]:
    from djl_handlers.engines.hf.prefix_cache import PrefixCache
    from djl_handlers.model.embedded import embedded_model_dir

    model_dir = str(embedded_model_dir())
    cached, plain = _service(model_dir, dtype, True), _service(model_dir, dtype, False)
    tokenizer = plain.engine.tokenizer
    per_turn: list[dict[str, list[float]]] = [{"on": [], "off": [], "cached": [], "prompt": []} for _ in range(turns)]
    totals = {"on": [0.0, 0], "off": [0.0, 0]}
    identical = True
    for round_index in range(rounds):
        cached.engine.prefix_cache = PrefixCache(cached.engine.prefix_cache.memory_bytes)  # empty at each round
        answers: list[str] = []
        for turn in range(turns):
            prompt = tokenizer.apply_chat_template(_messages(turn, answers), tokenize=False, add_generation_prompt=True)
            order = [("on", cached), ("off", plain)]
            if (round_index + turn) % 2:
                order.reverse()
            got = {name: _turn(service, prompt, new_tokens) for name, service in order}
            identical = identical and got["on"]["text"] == got["off"]["text"]
            answers.append(got["off"]["text"])
            slot = per_turn[turn]
            slot["prompt"].append(len(tokenizer.encode(prompt)))
            slot["cached"].append(got["on"]["cached"])
            for name in ("on", "off"):
                slot[name].append(got[name]["ttft_s"])
                totals[name][0] += got[name]["total_s"]
                totals[name][1] += got[name]["tokens"]
    rows = []
    for turn, slot in enumerate(per_turn, start=1):
        on, off = median(slot["on"]), median(slot["off"])
        rows.append({"turn": turn, "prompt_tokens": int(median(slot["prompt"]) or 0),
                     "cached_tokens": int(median(slot["cached"]) or 0), "ttft_on_ms": rnd((on or 0) * 1000, 1),
                     "ttft_off_ms": rnd((off or 0) * 1000, 1), "ttft_ratio": rnd((on or 0) / off if off else None, 3)})
    tok_s = {name: rnd(count / seconds, 1) if seconds else None for name, (seconds, count) in totals.items()}
    long_turns = [r["ttft_ratio"] for r in rows if r["cached_tokens"] >= 512]
    return {"rounds": rounds, "turns": turns, "new_tokens": new_tokens, "dtype": dtype, "rows": rows,
            "tok_s": tok_s, "tok_s_ratio": rnd(tok_s["on"] / tok_s["off"], 3) if tok_s["off"] else None,
            "identical_answers": identical, "ttft_ratio_max_on_512_shared": max(long_turns) if long_turns else None}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prefix_cache", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 3 turns")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=len(QUESTIONS))
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per turn")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    args = parser.parse_args(argv)
    setup_torch()
    started = context()
    rounds, turns = (1, 3) if args.quick else (args.rounds, min(args.turns, len(QUESTIONS)))
    report = run_benchmark(args.quick, rounds, turns, args.new_tokens, args.dtype)
    print_table(report["rows"], ["turn", "prompt_tokens", "cached_tokens", "ttft_on_ms", "ttft_off_ms", "ttft_ratio"],
                f"prefix cache, multi-turn chat ({args.dtype}, median of {rounds} round(s))")
    print("tok/s:", report["tok_s"], "ratio", report["tok_s_ratio"], "identical answers:", report["identical_answers"])
    print("max TTFT ratio on turns with >= 512 cached tokens:", report["ttft_ratio_max_on_512_shared"])
    write_report("prefix_cache", report, args.quick, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
