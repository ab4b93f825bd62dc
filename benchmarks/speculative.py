"""``python -m benchmarks speculative``: prompt-lookup speculative decoding in the HF engine, side by side.

Three HF handlers on the embedded SmolLM2 (one with ``option.speculative_config`` ngram, one without,
and one with it whose rule is off: it verifies every candidate, as the engine did before the rule)
serve the same burst of greedy requests in alternated rounds (which goes first rotates), each
through DJL's rolling-batch loop in process (``RollingBatchDriver``, streaming). Four workloads:

* ``copy``: chat prompts that paste a text and ask for it back edited (fix the spelling, change a
  name, turn it into a list): the answer copies long runs of the prompt, prompt lookup's best case;
* ``mixed``: the mixed workload of the other benchmarks (:func:`benchmarks.workload.mixed_workload`:
  slices of a five-sentence text repeated, as prompts, 12-123 new tokens): the model continues the
  repetition, so this one is copy-friendly too;
* ``fresh``: short chat questions with nothing to copy (a poem, an explanation, a list): lookup finds
  few candidates and most are rejected, the cost side;
* ``blend``: half of each in one burst (copy and fresh prompts alternating): rows that pay for
  verification next to rows that do not.

Before the rounds each handler serves one short unmeasured burst (first-use costs: kernel shapes,
allocations).

Per round and workload: generated tokens per second of the whole burst and median time to first
token of each handler, their ratios (with / without), the acceptance rate and tokens per row and step
of the speculating engine, the steps it ran plain although rows had candidates (verifying them was
not expected to pay), the load average, and whether the answers are identical (greedy: they must
be). Results:
``benchmarks/results/speculative.json``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from benchmarks.common import context, median, print_table, rnd, write_report

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
PASSAGES = [
    "The history of computing spans from mechanical calculators to modern microprocessors. Early machines such "
    "as the difference engine were designed to tabulate polynomial functions. In the twentieth century, "
    "electromechanical relays gave way to vacuum tubes, then to transistors and integrated circuits.",
    "Maria opened the small bakery on Elm Street in 1998. Every morning she baked bread, croissants and "
    "cinnamon rolls before the sun rose, and by seven o'clock a line of neighbours waited at the door.",
    "To reset the router, unplug it from the wall, wait thirty seconds, and plug it back in. When the green "
    "light stops blinking, open the settings page and sign in with the password printed on the label.",
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules. Plants take in "
    "carbon dioxide through their leaves and water through their roots, and they release oxygen.",
]
TASKS = [
    "Rewrite this text exactly, but fix any spelling mistakes:\n\n{text}",
    "Repeat the following paragraph word for word:\n\n{text}",
    "Copy this text and replace every full stop with an exclamation mark:\n\n{text}",
    "Rewrite the following text as it is, then add one sentence at the end:\n\n{text}",
]


def _service(model_dir: str, dtype: str, speculative: dict[str, Any] | None) -> Any:
    from djl_handlers.io import Input
    from djl_handlers.service import InferenceService

    service = InferenceService("huggingface")
    init = {"model_id": model_dir, "dtype": dtype, "rolling_batch": "scheduler", "cpu_threads": "fixed"}
    if speculative:
        init["speculative_config"] = json.dumps(speculative)
    assert service.handle(Input.from_parts(init, ())) is None
    return service


def copy_workload(tokenizer: Any, n: int, new_tokens: int) -> list[tuple[str, int]]:
    """``n`` chat prompts pasting a passage and asking for it back edited."""
    prompts = []
    for i in range(n):
        text = PASSAGES[i % len(PASSAGES)]
        task = TASKS[(i // len(PASSAGES)) % len(TASKS)].format(text=text)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": task}], tokenize=False,
                                               add_generation_prompt=True)
        prompts.append((prompt, new_tokens))
    return prompts


QUESTIONS = [
    "Write a short poem about the sea.", "Explain how a bicycle gear works.",
    "Give me three ideas for a birthday party.",
    "Why is the sky blue?", "Describe a busy market in the morning.", "What should I pack for a hiking trip?",
    "Tell me a story about a lost robot.", "How do vaccines train the immune system?",
]


def fresh_workload(tokenizer: Any, n: int, new_tokens: int) -> list[tuple[str, int]]:
    """``n`` chat questions whose answers copy nothing from the prompt."""
    return [(tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                           tokenize=False, add_generation_prompt=True), new_tokens) for i in range(n)]


def mixed_prompts(tokenizer: Any, n: int) -> list[tuple[str, int]]:
    from benchmarks.workload import mixed_workload

    return [(job.prompt, job.max_new_tokens) for job in mixed_workload(tokenizer, n)]


def burst(service: Any, prompts: list[tuple[str, int]]) -> dict[str, Any]:
    """Every prompt at once through DJL's rolling-batch loop: tok/s, TTFT per request, the answers."""
    from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

    driver = RollingBatchDriver(service.handle)
    started = time.perf_counter()
    reqs = [driver.submit(json_request({"inputs": p, "stream": True, "parameters": {"max_new_tokens": n}}))
            for p, n in prompts]
    first: dict[int, float] = {}
    while any(not r.done for r in reqs):
        driver.step()
        now = time.perf_counter() - started
        for i, req in enumerate(reqs):
            if req.chunks and i not in first:
                first[i] = now
    wall = time.perf_counter() - started
    lines = [[json.loads(x) for x in r.text.splitlines() if x.strip()] for r in reqs]
    tokens = sum(len(x) for x in lines)
    return {"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall, "ttft_p50_s": median(list(first.values())),
            "texts": [x[-1].get("generated_text") if x else None for x in lines]}


def run_benchmark(quick: bool, rounds: int, n: int, new_tokens: int, dtype: str,
                  ngram: dict[str, Any] | None = None) -> dict[str, Any]:
    from djl_handlers.model.embedded import embedded_model_dir

    model_dir = str(embedded_model_dir())
    ngram = ngram or NGRAM
    from djl_handlers.engines.hf.speculation_policy import StepCost

    spec, plain = _service(model_dir, dtype, ngram), _service(model_dir, dtype, None)
    always = _service(model_dir, dtype, ngram)  # the rule off: every step with a candidate verifies it
    always.engine.speculator.cost = StepCost.free()
    tokenizer = plain.engine.tokenizer
    copy, fresh = copy_workload(tokenizer, n, new_tokens), fresh_workload(tokenizer, n, new_tokens)
    workloads = {"copy": copy, "mixed": mixed_prompts(tokenizer, n), "fresh": fresh,
                 "blend": [(copy if i % 2 == 0 else fresh)[i // 2] for i in range(n)]}
    for service in (spec, plain, always):  # first-use costs out of the measured rounds
        burst(service, copy_workload(tokenizer, n, 8))
    report: dict[str, Any] = {"rounds": rounds, "n": n, "dtype": dtype, "ngram": ngram, "workloads": {}}
    for name, prompts in workloads.items():
        rows, identical = [], True
        for round_index in range(rounds):
            before = spec.engine.spec_decode_stats()
            order = [("on", spec), ("off", plain), ("always", always)]
            order = order[round_index % 3:] + order[:round_index % 3]  # which goes first rotates
            got = {label: burst(service, prompts) for label, service in order}
            after = spec.engine.spec_decode_stats()
            drafted = after["spec_decode_num_draft_tokens"] - before["spec_decode_num_draft_tokens"]
            accepted = after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"]
            row_steps = after["spec_decode_num_row_steps"] - before["spec_decode_num_row_steps"]
            declined = after["spec_decode_num_declined_steps"] - before["spec_decode_num_declined_steps"]
            identical = identical and got["on"]["texts"] == got["off"]["texts"] == got["always"]["texts"]
            on, off = got["on"], got["off"]
            rows.append({"round": round_index + 1, "first": order[0][0], "tok_s_on": rnd(on["tok_s"], 1),
                         "tok_s_off": rnd(off["tok_s"], 1), "tok_s_ratio": rnd(on["tok_s"] / off["tok_s"], 3),
                         "ttft_on_ms": rnd(on["ttft_p50_s"] * 1000, 1), "ttft_off_ms": rnd(off["ttft_p50_s"] * 1000, 1),
                         "ttft_ratio": rnd(on["ttft_p50_s"] / off["ttft_p50_s"], 3),
                         "always_ratio": rnd(got["always"]["tok_s"] / off["tok_s"], 3),
                         "acceptance_rate": rnd(accepted / drafted if drafted else 0.0, 3),
                         "tokens_per_row_step": rnd(1 + accepted / row_steps if row_steps else 1.0, 3),
                         "declined_steps": declined, "load_1m": rnd(os.getloadavg()[0], 2), "tokens": on["tokens"]})
        report["workloads"][name] = {
            "rows": rows, "identical_answers": identical,
            "tok_s_ratio_median": rnd(median([r["tok_s_ratio"] for r in rows]), 3),
            "always_ratio_median": rnd(median([r["always_ratio"] for r in rows]), 3),
            "ttft_ratio_median": rnd(median([r["ttft_ratio"] for r in rows]), 3),
            "prompt_tokens_median": median([len(tokenizer.encode(p)) for p, _ in prompts])}
    return report


COLUMNS = ["round", "first", "tok_s_on", "tok_s_off", "tok_s_ratio", "ttft_on_ms", "ttft_off_ms", "ttft_ratio",
           "always_ratio", "acceptance_rate", "tokens_per_row_step", "declined_steps", "load_1m"]


def run(quick: bool, rounds: int = 4, n: int = 8, new_tokens: int = 64, dtype: str = "fp32",
        ngram: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run, print the tables and write ``benchmarks/results/speculative.json`` (``ngram``: the
    ``option.speculative_config`` object, :data:`NGRAM` by default)."""
    started = context()
    rounds, new_tokens = (1, 32) if quick else (rounds, new_tokens)
    report = run_benchmark(quick, rounds, n, new_tokens, dtype, ngram)
    for name, block in report["workloads"].items():
        print_table(block["rows"], COLUMNS, f"speculative ({name} workload, {n} requests at once, {dtype})")
        print(f"{name}: median tok/s ratio {block['tok_s_ratio_median']} (verifying every candidate: "
              f"{block['always_ratio_median']}), TTFT ratio {block['ttft_ratio_median']}, "
              f"identical answers: {block['identical_answers']}")
    write_report("speculative", report, quick, started)
    return report
