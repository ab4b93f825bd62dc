"""Vision-language chat served: ``djl-handlers serve`` (HF engine) against ``vllm serve`` and against
transformers' ``generate()`` one request at a time, on one random-weight LLaVA-style model in fp32
(:func:`djl_handlers.model.tiny_vision.tiny_vlm_dir`: CLIP 336 px / patch 14, 576 image tokens, a
2-layer Llama of width 64 with the SmolLM2 tokenizer; the speed of a forward does not depend on the
weights' values).

Both servers stay up side by side on the same model folder: ours with ``option.rolling_batch=scheduler``,
``max_rolling_batch_size`` = the burst, ``max_model_len=2048`` and one image per prompt; vLLM's OpenAI
server (what ``vllm serve`` runs, vLLM 0.32's CPU build in ``.venv-vllm``) with the settings of
:mod:`benchmarks.architectures` (its defaults, ``OMP_NUM_THREADS=2``, 2 GiB of KV cache) and
``--max-num-seqs`` = the burst, ``--max-model-len 2048``, ``--limit-mm-per-prompt {"image": 1}``. Both
prefill up to 2,048 prompt tokens per step (their defaults).

Every run is a burst of 16 streamed chat requests sent at once (:mod:`benchmarks.vision_client`), each
generating exactly 64 tokens (``ignore_eos``, greedy); output tok/s = the burst's completion tokens
over its wall time, TTFT mean / p50 / p99 per request. The runs of a round, in an order rotating from
round to round, after one warm-up burst of each kind per server:

* ``ours`` / ``vllm``: 16 requests, each one distinct 336x336 JPEG as a ``data:`` URL and a question
  (591 prompt tokens); the ratio ours / vLLM per round (goal >= 1.1);
* ``generate``: the same 16 requests in this process through transformers' ``generate()`` one at a
  time (JPEG decoded, the processor's inputs, greedy, 64 new tokens); the ratio ours / generate
  (goal >= 2); greedy texts are compared with both servers';
* ``ours-text`` / ``ours-mixed`` (and ``vllm-text`` / ``vllm-mixed`` for context): 16 text prompts of
  the image prompts' length, and 8 image + 8 text requests interleaved; mixed tok/s over the mean of
  image-alone and text-alone tok/s of the same round.

Each round draws new images and text tags, so no prefix cache ever sees a prompt twice. Every run
records the machine's steal (:func:`benchmarks.common.host_cpu`). ``--profile S`` then samples our
worker with py-spy for S seconds under back-to-back image bursts and sorts the samples into stages
(image load, processor, vision encoder, text prefill, decode, the rest).

vLLM's LLaVA module imports a transformers module that needs torchvision, which ``.venv-vllm`` leaves
out: the project's start-up hook ``tests/vllm_cpu/torchvision_free`` goes on vLLM's ``PYTHONPATH`` (it
serves the module's torchvision-free twin), so both servers run the same PIL image processor::

    .venv/bin/python -m benchmarks.vision [--rounds 8] [--profile 12] [--no-vllm] [--no-generate] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, context, host_cpu, host_delta, median, pct, print_table, rnd, stolen, stop_process
from benchmarks.common import write_report as save_report
from benchmarks.vision_client import QUESTION, Burst, chat_body, image_jpeg, image_message, run_burst, text_message

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
#: the start-up hook that lets vLLM's LLaVA import without torchvision (``.venv-vllm`` has none)
TORCHVISION_FREE = ROOT / "tests" / "vllm_cpu" / "torchvision_free"
SERVED_NAME = "vision"
IMAGE_RUNS = ("ours", "vllm")


@dataclass(frozen=True)
class Work:
    """One burst: ``requests`` requests at once, ``new_tokens`` each."""

    requests: int = 16
    new_tokens: int = 64


# ----------------------------------------------------------------------------------------- servers


def _wait(url: str, path: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    from benchmarks.architectures import _wait as wait

    wait(url, path, proc, log, timeout)


def _env() -> dict[str, str]:
    from benchmarks.architectures import _env as env

    return env()


def _port() -> int:
    from benchmarks.server import free_port

    return free_port()


@contextlib.contextmanager
def serve_ours(model_dir: Path, work: Work, root: Path) -> Iterator[tuple[str, int]]:
    """``djl-handlers serve`` with the HF engine on ``model_dir``; yields (url, front-end pid)."""
    folder = root / "ours"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "serving.properties").write_text("\n".join([
        "engine=Python", "option.entryPoint=djl_handlers.huggingface", f"option.model_id={model_dir}",
        "option.dtype=fp32", "option.rolling_batch=scheduler", f"option.max_rolling_batch_size={work.requests}",
        "option.max_model_len=2048", 'option.limit_mm_per_prompt={"image": 1}']) + "\n")
    port = _port()
    code = "import sys; from djl_handlers.cli import main; sys.exit(main())"
    command = [sys.executable, "-c", code, "serve", str(folder), "--host", "127.0.0.1", "--port", str(port)]
    with _served(command, {**_env(), "PYTHONPATH": str(ROOT)}, ROOT, root / "ours.log", port, "/ping", 300) as up:
        yield up


@contextlib.contextmanager
def _served(command: list[str], env: dict[str, str], cwd: Path, log: Path, port: int, health: str,
            timeout: float) -> Iterator[tuple[str, int]]:
    """``command`` started as a server on ``port`` (output to ``log``), up once ``health`` answers;
    yields (url, pid) and stops it after."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, env=env, cwd=str(cwd), stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait(url, health, proc, log, timeout)
        yield url, proc.pid
    finally:
        stop_process(proc, 60)


@contextlib.contextmanager
def serve_vllm(model_dir: Path, work: Work, root: Path, extra_path: str) -> Iterator[tuple[str, int]]:
    """vLLM's OpenAI server on ``model_dir`` (``extra_path`` on its ``PYTHONPATH``); yields (url, pid)."""
    port = _port()
    command = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
               "--dtype", "float32", "--max-num-seqs", str(work.requests), "--max-model-len", "2048",
               "--limit-mm-per-prompt", '{"image": 1}', "--seed", "0"]
    with _served(command, {**_env(), "PYTHONPATH": extra_path}, root, root / "vllm.log", port, "/health", 600) as up:
        yield up


def vllm_extra_path(folder: str | None) -> str:
    """vLLM's ``PYTHONPATH``: ``folder`` (if given) and the start-up hook that lets its LLaVA import
    without torchvision (:data:`TORCHVISION_FREE`); exits when vLLM cannot import its LLaVA module."""
    path = os.pathsep.join(p for p in (folder, str(TORCHVISION_FREE)) if p)
    probe = [str(VLLM_PYTHON), "-c", "import vllm.model_executor.models.llava"]
    done = subprocess.run(probe, capture_output=True, timeout=300, env={**os.environ, "PYTHONPATH": path})
    if done.returncode != 0:
        raise SystemExit(f"vLLM cannot import its LLaVA module with PYTHONPATH={path}:\n"
                         f"{done.stderr.decode(errors='replace')[-1500:]}\n(or run with --no-vllm)")
    return path


# ---------------------------------------------------------------------------------------- workload


class Prompts:
    """The round's requests: image prompts, text prompts of the same token count, the mixed burst."""

    def __init__(self, model_dir: Path, work: Work) -> None:
        from transformers import AutoProcessor

        from benchmarks.workload import TEXT

        self.work = work
        self.processor = AutoProcessor.from_pretrained(str(model_dir), local_files_only=True)
        self.tokenizer = self.processor.tokenizer
        self.ids = self.tokenizer.encode(TEXT * 40)
        self.image_tokens = self._image_tokens()
        self.text_tokens = self._fit(self.image_tokens)

    def _image_tokens(self) -> int:
        """The prompt tokens of an image request, the processor expanding its image."""
        import io

        from PIL import Image

        content = [{"type": "image"}, {"type": "text", "text": QUESTION}]
        prompt = self.processor.apply_chat_template([{"role": "user", "content": content}],
                                                    add_generation_prompt=True, tokenize=False)
        picture = Image.open(io.BytesIO(image_jpeg(0))).convert("RGB")
        return int(self.processor(text=[prompt], images=[[picture]], return_tensors="pt")["input_ids"].shape[1])

    def _text_tokens(self, message: dict[str, Any]) -> int:
        prompt = self.processor.apply_chat_template([{"role": "user", "content": message["content"]}],
                                                    add_generation_prompt=True, tokenize=False)
        return len(self.tokenizer.encode(prompt, add_special_tokens=False))

    def _fit(self, target: int) -> int:
        """The length of the text slice that gives a chat prompt of ``target`` tokens (give or take two)."""
        n = target
        for _ in range(4):
            n += target - self._text_tokens(self._text(0, "t1000", n))
        return n

    def _text(self, index: int, tag: str, n: int) -> dict[str, Any]:
        start = (index * 97 + len(tag) * 13) % (len(self.ids) - n)
        return text_message(f"[{tag} {index}] " + self.tokenizer.decode(self.ids[start:start + n]))

    def text(self, index: int, tag: str) -> dict[str, Any]:
        """A text request of the image requests' prompt length, opening with its own tag."""
        return self._text(index, tag, self.text_tokens)

    def images(self, seed: int, count: int) -> list[bytes]:
        return [image_jpeg(seed + i) for i in range(count)]

    def bodies(self, kind: str, seed: int) -> tuple[list[bytes], list[bytes]]:
        """(request bodies, the images of its image requests in order) of a burst of ``kind``:
        ``image``, ``text`` or ``mixed`` (image and text requests alternating)."""
        n, new = self.work.requests, self.work.new_tokens
        if kind == "image":
            jpegs = self.images(seed, n)
            return [chat_body(SERVED_NAME, image_message(j), new) for j in jpegs], jpegs
        if kind == "text":
            return [chat_body(SERVED_NAME, self.text(i, f"t{seed}"), new) for i in range(n)], []
        jpegs = self.images(seed, n // 2)
        out = []
        for i in range(n):
            message = image_message(jpegs[i // 2]) if i % 2 == 0 else self.text(i, f"m{seed}")
            out.append(chat_body(SERVED_NAME, message, new))
        return out, jpegs


class Generate:
    """transformers' ``generate()`` one request at a time, in this process, on the model folder."""

    def __init__(self, model_dir: Path, processor: Any) -> None:
        import torch
        from transformers import AutoModelForImageTextToText

        self.processor = processor
        self.model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32,
                                                                 local_files_only=True).eval()

    def run(self, jpegs: list[bytes], new_tokens: int) -> dict[str, Any]:
        """Each image request alone: JPEG decoded, the processor's inputs, greedy ``new_tokens``."""
        import io

        import torch
        from PIL import Image

        content = [{"type": "image"}, {"type": "text", "text": QUESTION}]
        prompt = self.processor.apply_chat_template([{"role": "user", "content": content}],
                                                    add_generation_prompt=True, tokenize=False)
        texts, tokens, latencies = [], 0, []
        began = time.perf_counter()
        with torch.inference_mode():
            for jpeg in jpegs:
                start = time.perf_counter()
                picture = Image.open(io.BytesIO(jpeg)).convert("RGB")
                inputs = self.processor(text=[prompt], images=[[picture]], return_tensors="pt")
                out = self.model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                          do_sample=False)
                n = int(inputs["input_ids"].shape[1])
                tokens += int(out.shape[1]) - n
                texts.append(self.processor.tokenizer.decode(out[0, n:], skip_special_tokens=True))
                latencies.append(time.perf_counter() - start)
        wall = time.perf_counter() - began
        return {"tok_s": rnd(tokens / wall, 1), "tokens": tokens, "wall_s": rnd(wall, 3), "failed": 0,
                "latency_p50_s": rnd(pct(latencies, 0.5), 3), "texts": texts}


# ------------------------------------------------------------------------------------------- runs


def burst_row(burst: Burst, kinds: list[str] | None = None) -> dict[str, Any]:
    """A burst's figures: output tok/s, TTFT mean / p50 / p99 (s), per kind of request in a mixed one."""
    ttfts = [r.ttft for r in burst.replies if r.ttft is not None]
    row: dict[str, Any] = {
        "tok_s": rnd(burst.tokens / burst.wall_s, 1) if burst.wall_s else None, "tokens": burst.tokens,
        "wall_s": rnd(burst.wall_s, 3), "failed": burst.failed,
        "ttft_mean_s": rnd(sum(ttfts) / len(ttfts), 3) if ttfts else None,
        "ttft_p50_s": rnd(pct(ttfts, 0.5), 3), "ttft_p99_s": rnd(pct(ttfts, 0.99), 3),
        "prompt_tokens": sorted({r.prompt_tokens for r in burst.replies}),
        "errors": [r.error for r in burst.replies if r.error][:2],
    }
    if kinds:
        for kind in sorted(set(kinds)):
            own = [r.ttft for r, k in zip(burst.replies, kinds, strict=True) if k == kind and r.ttft is not None]
            row[f"{kind}_ttft_p50_s"] = rnd(pct(own, 0.5), 3)
    return row


def _measured(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    host0 = host_cpu()
    row = run()
    row["host_cpu_s"] = host_delta(host0, host_cpu())
    row["load_avg_1m"] = rnd(os.getloadavg()[0], 2)
    return row


def run_round(index: int, prompts: Prompts, urls: dict[str, str], generate: Generate | None) -> dict[str, Any]:
    """One round: every run on fresh prompts, the order rotating with ``index``."""
    seed = 1000 * (index + 1)
    image_bodies, jpegs = prompts.bodies("image", seed)
    text_bodies, _ = prompts.bodies("text", seed)
    mixed_bodies, _ = prompts.bodies("mixed", seed + 500)
    mixed_kinds = ["image" if i % 2 == 0 else "text" for i in range(len(mixed_bodies))]
    runs: dict[str, Callable[[], dict[str, Any]]] = {}
    for server, url in urls.items():
        runs[server] = partial(_burst, url, image_bodies, None, True)
        runs[f"{server}-text"] = partial(_burst, url, text_bodies)
        runs[f"{server}-mixed"] = partial(_burst, url, mixed_bodies, mixed_kinds)
    if generate is not None:
        runs["generate"] = lambda: generate.run(jpegs, prompts.work.new_tokens)
    names = list(runs)
    names = names[index % len(names):] + names[:index % len(names)]
    results = {name: _measured(runs[name]) for name in names}
    return {"round": index, "order": names, "runs": results, **_identical(results)}


def _burst(url: str, bodies: list[bytes], kinds: list[str] | None = None, texts: bool = False) -> dict[str, Any]:
    burst = run_burst(url, bodies)
    row = burst_row(burst, kinds)
    if texts:
        row["texts"] = [r.text for r in burst.replies]
    return row


def _identical(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """How many greedy image answers agree between the contenders of a round (their texts dropped)."""
    texts = {name: results[name].pop("texts") for name in ("ours", "vllm", "generate") if name in results}
    out: dict[str, Any] = {}
    names = list(texts)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            same = sum(x.strip() == y.strip() for x, y in zip(texts[a], texts[b], strict=True))
            out[f"identical_{a}_{b}"] = f"{same}/{len(texts[a])}"
    return out


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str = "tok_s") -> float | None:
    if not a or not b or a.get("failed") or b.get("failed") or not a.get(key) or not b.get(key):
        return None
    return rnd(a[key] / b[key], 3)


def _mixed_ratio(runs: dict[str, dict[str, Any]], server: str) -> float | None:
    image, text, mixed = runs.get(server), runs.get(f"{server}-text"), runs.get(f"{server}-mixed")
    if not (image and text and mixed) or any(r["failed"] for r in (image, text, mixed)):
        return None
    return rnd(mixed["tok_s"] / ((image["tok_s"] + text["tok_s"]) / 2), 3)


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-round ratios and their medians (plain, and over the rounds no run of which was stolen)."""
    def per_round(fn: Callable[[dict[str, dict[str, Any]]], float | None]) -> dict[str, Any]:
        values = [fn(r["runs"]) for r in rounds]
        clean = [v for v, r in zip(values, rounds, strict=True)
                 if v is not None and not stolen(*(run.get("host_cpu_s") for run in r["runs"].values()))]
        found = [v for v in values if v is not None]
        return {"per_round": values, "median": rnd(median(found), 3) if found else None,
                "median_unstolen": rnd(median(clean), 3) if clean else None, "unstolen_rounds": len(clean)}

    out: dict[str, Any] = {
        "ours_over_vllm_tok_s": per_round(lambda r: _ratio(r.get("ours"), r.get("vllm"))),
        "ours_over_vllm_ttft_mean": per_round(lambda r: _ratio(r.get("ours"), r.get("vllm"), "ttft_mean_s")),
        "ours_over_vllm_ttft_p50": per_round(lambda r: _ratio(r.get("ours"), r.get("vllm"), "ttft_p50_s")),
        "ours_over_vllm_text_tok_s": per_round(lambda r: _ratio(r.get("ours-text"), r.get("vllm-text"))),
        "ours_over_vllm_text_ttft_p50": per_round(lambda r: _ratio(r.get("ours-text"), r.get("vllm-text"),
                                                                   "ttft_p50_s")),
        "ours_over_vllm_mixed_tok_s": per_round(lambda r: _ratio(r.get("ours-mixed"), r.get("vllm-mixed"))),
        "ours_over_generate_tok_s": per_round(lambda r: _ratio(r.get("ours"), r.get("generate"))),
        "ours_mixed_over_mean_alone": per_round(lambda r: _mixed_ratio(r, "ours")),
        "vllm_mixed_over_mean_alone": per_round(lambda r: _mixed_ratio(r, "vllm")),
    }
    names = sorted({name for r in rounds for name in r["runs"]})
    out["medians"] = {name: {key: rnd(median([r["runs"][name][key] for r in rounds if name in r["runs"]
                                              and r["runs"][name].get(key) is not None]), 3)
                             for key in ("tok_s", "ttft_mean_s", "ttft_p50_s")} for name in names}
    return out


# ----------------------------------------------------------------------------------------- profile

#: Stages of our worker's time, the first frame name found in a sample's stack deciding.
STAGES = (("vision encoder", ("VisionSupport.features",)),
          ("image load (base64, decode, digest)", ("load_images",)),
          ("processor (resize, normalize, ids)", ("HFEngine.encode_media", "VisionSupport.encode")),
          ("text prefill", ("HFEngine._prefill",)),
          ("decode steps", ("HFEngine._decode",)),
          ("scheduling, sampling, output", ("Stepper.step",)))


def stage_of(stack: str) -> str:
    """The stage of one py-spy stack (``frame;frame;...``, outermost first)."""
    for stage, names in STAGES:
        if any(f";{name} (" in f";{stack}" for name in names):
            return stage
    return "other"


def stage_shares(raw: str) -> dict[str, float]:
    """Per stage, the share (%) of py-spy's raw samples (``stack count`` lines)."""
    counts: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[stage_of(stack)] = counts.get(stage_of(stack), 0) + int(n)
    total = sum(counts.values()) or 1
    return {stage: round(100 * n / total, 1) for stage, n in sorted(counts.items(), key=lambda kv: -kv[1])}


def stage_costs(prompts: Prompts, generate: Generate, count: int = 8) -> dict[str, Any]:
    """Milliseconds per image request (median of ``count``) of each stage our server runs for it, in
    this process on 2 threads: the server's own image load (base64, decode, digest), the processor, the
    vision encoder alone and batched by 3 (one prefill step's images), and the whole prefill forward
    of one image prompt (encoder included, stock transformers)."""
    import torch

    from djl_handlers.config.media import MediaOptions
    from djl_handlers.media.images import load_images
    from djl_handlers.media.records import ImageRef

    jpegs = prompts.images(700_000, count)
    urls = [image_message(j)["content"][0]["image_url"]["url"] for j in jpegs]
    content = [{"type": "image"}, {"type": "text", "text": QUESTION}]
    prompt = prompts.processor.apply_chat_template([{"role": "user", "content": content}],
                                                   add_generation_prompt=True, tokenize=False)
    times: dict[str, list[float]] = {}

    @contextlib.contextmanager
    def timed(name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        times.setdefault(name, []).append(1000 * (time.perf_counter() - start))

    model = generate.model
    with torch.inference_mode():
        for url in urls:
            with timed("image load"):
                image = load_images([ImageRef(url, "p")], MediaOptions())[0].image
            with timed("processor"):
                inputs = prompts.processor(text=[prompt], images=[[image]], return_tensors="pt")
            with timed("vision encoder, 1 image"):
                model.get_image_features(pixel_values=inputs["pixel_values"])
            three = torch.cat([inputs["pixel_values"]] * 3)
            with timed("vision encoder, per image of 3"):
                model.get_image_features(pixel_values=three)
            with timed("prefill forward, 1 image prompt"):
                model(**inputs, logits_to_keep=1)
    times["vision encoder, per image of 3"] = [t / 3 for t in times["vision encoder, per image of 3"]]
    return {name: rnd(median(values[1:] or values), 2) for name, values in times.items()}


def _worker_pid(front: int) -> int | None:
    from benchmarks.served_engines import _descendants

    for pid in _descendants(front):
        with contextlib.suppress(OSError):
            if "djl_handlers.worker" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                return pid
    return None


def profile(url: str, front: int, prompts: Prompts, seconds: float, root: Path) -> dict[str, Any]:
    """py-spy on our worker for ``seconds`` while image bursts run back to back."""
    spy = Path(sys.executable).with_name("py-spy")
    pid = _worker_pid(front)
    if not spy.exists() or pid is None:
        return {"skipped": "py-spy not installed" if not spy.exists() else "worker not found"}
    bursts = [prompts.bodies("image", 900_000 + 100 * i)[0] for i in range(int(seconds) + 2)]
    out = root / "profile.txt"
    rate = 100
    proc = subprocess.Popen([str(spy), "record", "-p", str(pid), "-d", str(int(seconds)), "-r", str(rate),
                             "--format", "raw", "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rows = []
    try:
        time.sleep(1.0)
        deadline = time.monotonic() + seconds - 1.5
        for bodies in bursts:
            if time.monotonic() > deadline:
                break
            rows.append(burst_row(run_burst(url, bodies))["tok_s"])
        proc.wait(timeout=seconds + 60)
    finally:
        if proc.poll() is None:
            stop_process(proc)
    if not out.exists():
        return {"skipped": f"py-spy wrote nothing: {(proc.stderr.read() if proc.stderr else b'').decode()[-300:]}"}
    raw = out.read_text(errors="replace")
    samples = sum(int(n) for n in re.findall(r" (\d+)$", raw, flags=re.M))
    return {"seconds": seconds, "rate_hz": rate, "samples": samples,
            "busy_share": rnd(samples / (seconds * rate), 2), "stages_pct": stage_shares(raw),
            "tok_s_while_sampled": rows}


# -------------------------------------------------------------------------------------------- main


def _warm(prompts: Prompts, urls: dict[str, str], generate: Generate | None) -> dict[str, Any]:
    warm: dict[str, Any] = {}
    for server, url in urls.items():
        for kind in ("image", "text", "mixed"):
            warm[f"{server}-{kind}"] = burst_row(run_burst(url, prompts.bodies(kind, 500_000 + len(warm))[0]))
    if generate is not None:
        warm["generate"] = {k: v for k, v in generate.run(prompts.images(600_000, 1), 8).items() if k != "texts"}
    return warm


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    from djl_handlers.model.tiny_vision import tiny_vlm_dir

    work = Work(args.requests, args.new_tokens)
    extra = "" if args.no_vllm else vllm_extra_path(args.vllm_path)
    began = time.monotonic()
    rounds: list[dict[str, Any]] = []
    report: dict[str, Any] = {"work": work.__dict__, "dtype": "fp32", "model": f"tiny_vlm_dir(llava, size={args.size})"}
    with tempfile.TemporaryDirectory(prefix="bench-vision-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        model_dir = tiny_vlm_dir(root / "llava", "llava", size=args.size)
        prompts = Prompts(model_dir, work)
        report["prompt_tokens"] = {"image": prompts.image_tokens, "text_target": prompts.image_tokens}
        servers = {"ours": stack.enter_context(serve_ours(model_dir, work, root))}
        if not args.no_vllm:
            servers["vllm"] = stack.enter_context(serve_vllm(model_dir, work, root, extra))
        report["start_s"] = rnd(time.monotonic() - began, 1)
        urls = {name: url for name, (url, _) in servers.items()}
        generate = None if args.no_generate else Generate(model_dir, prompts.processor)
        report["warmup"] = _warm(prompts, urls, generate)
        for index in range(args.rounds):
            if time.monotonic() - began > args.budget_s:
                report["stopped_early"] = f"budget of {args.budget_s} s spent after {index} rounds"
                break
            rounds.append(run_round(index, prompts, urls, generate))
            print(json.dumps({k: v for k, v in rounds[-1].items() if k != "runs"}),
                  {name: run["tok_s"] for name, run in rounds[-1]["runs"].items()}, flush=True)
        if args.profile:
            report["profile"] = profile(urls["ours"], servers["ours"][1], prompts, args.profile, root)
            if generate is not None:
                report["profile"]["stage_ms_in_process"] = stage_costs(prompts, generate)
        for name in servers:  # the servers' logs, kept beside the report
            log = root / f"{name}.log"
            if log.exists():
                report.setdefault("log_tail", {})[name] = log.read_text(errors="replace").splitlines()[-5:]
    report["rounds"] = rounds
    report.update(summary(rounds))
    report["wall_s"] = rnd(time.monotonic() - began, 1)
    return report


def print_report(report: dict[str, Any]) -> None:
    rows = [{"round": r["round"], **{name: run["tok_s"] for name, run in r["runs"].items()}} for r in report["rounds"]]
    if rows:
        print_table(rows, list(rows[0]), "output tok/s per run")
    keys = [k for k in report if k.startswith(("ours_over", "ours_mixed", "vllm_mixed"))]
    print_table([{"ratio": k, **report[k]} for k in keys],
                ["ratio", "per_round", "median", "median_unstolen", "unstolen_rounds"], "ratios")
    print_table([{"run": name, **m} for name, m in report["medians"].items()],
                ["run", "tok_s", "ttft_mean_s", "ttft_p50_s"], "medians")
    if "profile" in report:
        print("profile of our worker:", json.dumps(report["profile"]))


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print the tables, write ``benchmarks/results/vision.json``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vision", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--size", default="tiny", choices=("tiny", "small"),
                        help="the random LLaVA's size: tiny (toy widths: per-step overhead) or small (compute)")
    parser.add_argument("--requests", type=int, default=16, help="requests per burst (and the servers' batch)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--profile", type=float, default=0, metavar="S",
                        help="then py-spy our worker for S seconds under image bursts")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--no-generate", action="store_true")
    parser.add_argument("--vllm-path", help="a folder put first on vLLM's PYTHONPATH (e.g. one with torchvision)")
    parser.add_argument("--budget-s", type=float, default=720, help="start no round after this many seconds")
    parser.add_argument("--out", default="vision", help="the report's name under benchmarks/results")
    parser.add_argument("--quick", action="store_true", help="1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
    from benchmarks.common import setup_torch

    setup_torch()
    started = context()
    report = run_benchmark(args)
    print_report(report)
    save_report(args.out, report, args.quick, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
