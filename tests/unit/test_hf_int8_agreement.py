"""``option.quantize=dynamic_int8`` on the embedded model agrees with fp32 as docs/engines.md
documents ("Int8 on the CPU"), teacher-forced over fp32's greedy texts of a fixed prompt set: the
int8 model's argmax equals fp32's wherever fp32's two best logits are at least :data:`GAP` apart,
and the mean |log p_int8 - log p_fp32| of fp32's own tokens stays under :data:`MEAN_DLOGP`.
"""

from __future__ import annotations

import functools
import statistics
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from djl_handlers.engines.hf.cpu import int8  # noqa: E402

pytest_plugins = ["conftest_models"]
GAP = 2.5
MEAN_DLOGP = 0.25
PROMPTS = ("The capital of France is", "Deep learning is", "def fibonacci(n):", "The three primary colors are",
           "My favourite book is", "Dear hiring manager,")


@functools.cache
def _load(path: Path, quantize: str) -> Any:
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.hf.loader import LoadOptions, load_model

    props = {"model_id": str(path), "dtype": "fp32", "rolling_batch": "scheduler",
             **({"quantize": quantize} if quantize else {})}
    return load_model(LoadOptions.from_config(ServingConfig.from_properties(props, engine="huggingface")))


@pytest.mark.slow
@pytest.mark.skipif(int8.unavailable_reason() is not None, reason=str(int8.unavailable_reason()))
def test_int8_greedy_agrees_with_fp32_where_fp32_is_decided(embedded_dir: Path) -> None:
    ref, low = _load(embedded_dir, ""), _load(embedded_dir, "dynamic_int8")
    assert "int8" in low.cpu_patches["cpu_linear"], low.cpu_patches
    agree = total = 0
    distances: list[float] = []
    for text in PROMPTS:
        ids = ref.tokenizer.encode(text)
        with torch.inference_mode():
            seq = ref.model.generate(torch.tensor([ids]), max_new_tokens=20, min_new_tokens=20, do_sample=False)
            want = ref.model(seq).logits[0, len(ids) - 1:-1].float()
            got = low.model(seq).logits[0, len(ids) - 1:-1].float()
        tokens = seq[0, len(ids):, None]
        distances.append(float((want.log_softmax(-1).gather(1, tokens) - got.log_softmax(-1).gather(1, tokens))
                               .abs().mean()))
        top = want.topk(2).values
        clear = (top[:, 0] - top[:, 1]) >= GAP
        same = want.argmax(-1) == got.argmax(-1)
        assert bool(same[clear].all()), (text, (top[:, 0] - top[:, 1])[clear & ~same])
        agree += int(same.sum())
        total += len(same)
    print(f"argmax agreement {agree}/{total}, mean |d log p| {statistics.mean(distances):.3f}")
    assert statistics.mean(distances) < MEAN_DLOGP
    assert agree >= total * 3 // 4
