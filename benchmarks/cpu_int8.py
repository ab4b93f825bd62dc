"""``option.quantize=dynamic_int8`` against fp32 on the HF engine: decode tok/s at 1 and 32 concurrent
requests side by side, and each variant's memory after loading.

The embedded model, greedy, ``ignore_eos``; both engines are loaded in one process and measured in
interleaved rounds (fp32, int8, fp32, ...), the median per variant reported with the int8/fp32 ratio of
each round's pair (the machine may be shared: read the spread). Memory: each variant loaded alone in
a child process, its PSS and RSS after loading (torch included).

    .venv/bin/python -m benchmarks.cpu_int8            # 3 rounds, 32 new tokens
    .venv/bin/python -m benchmarks.cpu_int8 --quick    # 1 round, 8 new tokens
    .venv/bin/python -m benchmarks.cpu_int8 --isa avx2 # everything capped at AVX2 (the int8 kernel's AVX2 path)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks.common import LOWER_ISA, ROOT, context, print_table, rnd, setup_torch, write_report
from benchmarks.cpu_dtypes import TOPICS

VARIANTS: dict[str, dict[str, str]] = {"fp32": {"dtype": "fp32"}, "int8": {"dtype": "fp32", "quantize": "dynamic_int8"}}
CLIENTS = (1, 32)


def load(options: dict[str, str]) -> Any:
    """One HF engine on the embedded model with ``options``."""
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.model.embedded import embedded_model_dir

    props = {"model_id": str(embedded_model_dir()), "rolling_batch": "scheduler",
             "max_rolling_batch_size": str(max(CLIENTS)), **options}
    return HFEngine.from_config(ServingConfig.from_properties(props, engine="huggingface"))


def run(engine: Any, prompts: list[list[int]], new: int) -> float:
    """Tokens per second of every prompt admitted at once, ``new`` greedy tokens each (prefill included)."""
    return run_tokens(engine, prompts, new)[0]


def run_tokens(engine: Any, prompts: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
    """:func:`run`'s tokens per second and the greedy tokens of each prompt."""
    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.params.generation import GenerationParameters

    params = GenerationParameters(max_new_tokens=new, ignore_eos_token=True)
    tokens: list[list[int]] = [[] for _ in prompts]
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        engine.add_request(EngineRequest(i, ids, params))
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].append(out.token_id)
            if len(tokens[out.request_id]) >= new:
                engine.release(out.request_id)
    return len(prompts) * new / (time.perf_counter() - start), tokens


def memory(name: str) -> dict[str, int]:
    """PSS and RSS (MiB) of this process after loading variant ``name``."""
    load(VARIANTS[name])
    found = {}
    with open("/proc/self/smaps_rollup") as smaps:
        for line in smaps:
            key = line.split(":")[0]
            if key in ("Rss", "Pss"):
                found[key.lower() + " MiB"] = int(line.split()[1]) // 1024
    return found


def speed(rounds: int, new: int) -> list[dict[str, Any]]:
    """Interleaved rounds of both variants at each client count."""
    from transformers import AutoTokenizer

    from djl_handlers.model.embedded import embedded_model_dir

    tok = AutoTokenizer.from_pretrained(str(embedded_model_dir()), local_files_only=True)
    engines = {name: load(options) for name, options in VARIANTS.items()}
    rows = []
    for clients in CLIENTS:
        prompts = [tok.encode(TOPICS[i % len(TOPICS)]) for i in range(clients)]
        tps: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(rounds):
            for name, engine in engines.items():
                tps[name].append(run(engine, prompts, new))
        ratios = [b / a for a, b in zip(tps["fp32"], tps["int8"], strict=True)]
        rows.append({"clients": clients, "fp32 tok/s": rnd(statistics.median(tps["fp32"]), 1),
                     "int8 tok/s": rnd(statistics.median(tps["int8"]), 1),
                     "int8/fp32": rnd(statistics.median(ratios)), "ratios": [rnd(r) for r in ratios]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="1 round, 8 new tokens")
    parser.add_argument("--isa", choices=("native", "avx2"), default="native",
                        help="avx2: oneDNN, ATen, MKL and the C kernels capped at AVX2 (LOWER_ISA)")
    parser.add_argument("--memory", choices=tuple(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.isa == "avx2" and any(os.environ.get(k) != v for k, v in LOWER_ISA.items()):
        # the caps must be in place before torch and the kernels load: run again in a child
        cmd = [sys.executable, "-m", "benchmarks.cpu_int8", *(argv if argv is not None else sys.argv[1:])]
        return subprocess.run(cmd, cwd=ROOT, env={**os.environ, **LOWER_ISA}).returncode
    setup_torch()
    if args.memory:
        print(json.dumps(memory(args.memory)))
        return 0
    rounds, new = (1, 8) if args.quick else (args.rounds, args.new)
    started = context()
    from djl_handlers.engines.hf.cpu.isa import features

    mem = {name: json.loads(subprocess.run([sys.executable, "-m", "benchmarks.cpu_int8", "--memory", name],
                                           cwd=ROOT, capture_output=True, text=True, check=True)
                            .stdout.strip().splitlines()[-1]) for name in VARIANTS}
    rows = speed(rounds, new)
    cpu = features().describe()
    print_table(rows, ["clients", "fp32 tok/s", "int8 tok/s", "int8/fp32", "ratios"],
                title=f"CPU {cpu['model']} ({cpu['isa']}, run at {args.isa}); {new} greedy tokens per request, "
                      f"{rounds} rounds")
    print_table([{"variant": name, **values} for name, values in mem.items()], ["variant", "pss MiB", "rss MiB"],
                title="memory after loading (whole process)")
    name = "cpu_int8" if args.isa == "native" else f"cpu_int8_{args.isa}"
    write_report(name, {"isa": args.isa, "cpu": cpu, "rows": rows, "memory": mem}, args.quick, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
