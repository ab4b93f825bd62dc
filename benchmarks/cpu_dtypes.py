"""Each dtype on each CPU path: greedy agreement with fp32 and the engine's decode speed, side by side.

For the embedded model, one child process per ISA setting (``native``: this CPU as it is; ``avx2``:
``ONEDNN_MAX_CPU_ISA=AVX2``, ``ATEN_CPU_CAPABILITY=avx2`` and the C kernels built for ``x86-64-v3``,
i.e. what an AVX2-only CPU runs) loads the model once per variant — fp32, bf16 (the packed layers'
choice for this CPU), bf16 over torch's own linear (``option.cpu_linear=torch``, the alternative the
choice was measured against) and fp16 — and runs the same greedy prompts through the HF engine in
one continuous batch. It reports, per variant: tokens/s of the whole run (prefill included) and its
ratio to fp32 in the same process, how many prompts give fp32's tokens exactly, and the mean share of
each prompt's tokens before the first difference.

    .venv/bin/python -m benchmarks.cpu_dtypes                 # both ISA settings, 16 prompts x 32 tokens
    .venv/bin/python -m benchmarks.cpu_dtypes --isa avx2 --quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

from benchmarks.common import LOWER_ISA, ROOT, context, print_table, rnd, setup_torch, write_report

VARIANTS: dict[str, dict[str, str]] = {
    "fp32": {"dtype": "fp32"},
    "bf16": {"dtype": "bf16"},
    "bf16, torch linear": {"dtype": "bf16", "cpu_linear": "torch"},
    "fp16": {"dtype": "fp16"},
}
TOPICS = ("The capital of France is", "Deep learning is", "Once upon a time", "The best way to cook rice is",
          "Water boils at", "A haiku about autumn:", "def fibonacci(n):", "The three primary colors are",
          "In 1969, astronauts", "The quick brown fox", "My favourite book is", "Photosynthesis converts",
          "To be or not to be", "The largest planet in the solar system", "SELECT name FROM", "Dear hiring manager,")


def run_variant(options: dict[str, str], prompts: list[list[int]], new: int) -> tuple[dict[int, list[int]], float]:
    """Greedy tokens of every prompt through one HF engine (all admitted at once) and the seconds taken."""
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.model.embedded import embedded_model_dir
    from djl_handlers.params.generation import GenerationParameters

    props = {"model_id": str(embedded_model_dir()), "rolling_batch": "scheduler",
             "max_rolling_batch_size": str(len(prompts)), **options}
    engine = HFEngine.from_config(ServingConfig.from_properties(props, engine="huggingface"))
    got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    params = GenerationParameters(max_new_tokens=new, ignore_eos_token=True)
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        engine.add_request(EngineRequest(i, ids, params))
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id].append(int(out.token_id))
            if len(got[out.request_id]) >= new:
                engine.release(out.request_id)
    return got, time.perf_counter() - start


def agreement(got: dict[int, list[int]], ref: dict[int, list[int]]) -> tuple[int, float]:
    """How many sequences equal the reference, and the mean share of tokens before the first difference."""
    same, shares = 0, []
    for i, want in ref.items():
        have = got[i]
        differ = (k for k, (a, b) in enumerate(zip(have, want, strict=False)) if a != b)
        prefix = next(differ, min(len(have), len(want)))
        same += have == want
        shares.append(prefix / max(1, len(want)))
    return same, sum(shares) / max(1, len(shares))


def child(isa: str, count: int, new: int) -> dict[str, Any]:
    """Measure every variant in this process (its environment already sets the ISA)."""
    setup_torch()
    from transformers import AutoTokenizer

    from djl_handlers.engines.hf.cpu.isa import features
    from djl_handlers.model.embedded import embedded_model_dir

    tok = AutoTokenizer.from_pretrained(str(embedded_model_dir()), local_files_only=True)
    prompts = [tok.encode(TOPICS[i % len(TOPICS)]) for i in range(count)]
    rows: list[dict[str, Any]] = []
    ref: dict[int, list[int]] = {}
    base = 0.0
    for name, options in VARIANTS.items():
        got, seconds = run_variant(options, prompts, new)
        tps = count * new / seconds
        if name == "fp32":
            ref, base = got, tps
        same, share = agreement(got, ref)
        rows.append({"isa": isa, "variant": name, "tok/s": rnd(tps, 1), "vs fp32": rnd(tps / base),
                     "same as fp32": f"{same}/{count}", "prefix share": rnd(share, 3)})
    return {"cpu": features().describe(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", choices=("native", "avx2", "both"), default="both")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="4 prompts x 8 tokens")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    count, new = (4, 8) if args.quick else (args.prompts, args.new)
    if args.child:
        print(json.dumps(child(args.isa, count, new)))
        return 0
    settings = ["native", "avx2"] if args.isa == "both" else [args.isa]
    if platform.machine() not in ("x86_64", "AMD64"):
        settings = [s for s in settings if s == "native"]
    started, report = context(), {"runs": []}
    for isa in settings:
        env = dict(os.environ, **(LOWER_ISA if isa == "avx2" else {}))
        done = subprocess.run([sys.executable, "-m", "benchmarks.cpu_dtypes", "--child", "--isa", isa,
                               "--prompts", str(count), "--new", str(new)],
                              cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        report["runs"].append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = [row for run in report["runs"] for row in run["rows"]]
    cpu = report["runs"][0]["cpu"]
    print_table(rows, ["isa", "variant", "tok/s", "vs fp32", "same as fp32", "prefix share"],
                title=f"CPU {cpu['model']} ({cpu['isa']}); {count} prompts x {new} greedy tokens, one batch")
    write_report("cpu_dtypes", report, args.quick, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
