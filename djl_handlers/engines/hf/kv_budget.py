"""The HF engine's KV-cache memory bound (``option.kv_cache_memory_bytes``): bytes per cached token,
the worst-case footprint of the rows a step would hold, and the ``auto`` budget.

The running batch is one left-padded slab (:mod:`djl_handlers.engines.hf.batch`): ``rows x width``
cells of ``bytes_per_token`` each, where the width follows the longest row. A row never grows past
its *final length* ``min(prompt + max_new_tokens, max_model_len)``, and a row that is still running
after ``s`` more steps has ``s`` tokens left, so the slab's width never exceeds the longest final
length of the rows in it. The bound therefore reserves, for a set of rows,

    bytes_per_token x (rows x longest final length + prefill rows x longest prompt)

— the padded slab at its worst, plus the prefill group's own cache, which exists beside the slab
until it is merged. A queued request is admitted only when that stays within the budget (else it
waits, and the requests behind it with it); a request whose worst case alone exceeds the budget can
never run and is refused at once (``EngineOutOfMemory``, HTTP 507). Reserving the worst case means
no request is ever stopped half way for memory (the engine cannot pre-empt and recompute a row, as
vLLM does); the price is fewer concurrent rows when ``max_new_tokens`` is far above what the
requests really generate.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from djl_handlers.engines.hf.rows import Row

__all__ = ["AUTO_SHARE", "auto_budget", "bytes_per_token", "final_length", "footprint", "free_memory", "kv_limit"]

LOG = logging.getLogger(__name__)

AUTO_SHARE = 0.5  # ``auto``: this share of the memory free on the model's device after loading


def bytes_per_token(model: Any, dtype: Any = None) -> int:
    """Bytes one cached token takes over every layer: keys and values of each KV head, in ``dtype``
    (a ``torch.dtype``; None: the model's), what the slab holds per row and column."""
    from transformers import DynamicCache

    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or int(text.hidden_size) // heads)
    layers = len(DynamicCache(config=config).layers)
    if dtype is not None:
        import torch

        element = torch.empty((), dtype=dtype).element_size()
    else:
        element = next(p for p in model.parameters() if p.is_floating_point()).element_size()
    return 2 * layers * kv_heads * head_dim * element


def final_length(row: Row, max_model_len: int) -> int:
    """The most tokens ``row`` will ever hold in the cache."""
    request = row.request
    return min(len(request.prompt_ids) + int(request.params.max_new_tokens), max_model_len)


def footprint(held: Iterable[Row], prefill: Iterable[Row], max_model_len: int) -> int:
    """Cached tokens (slab cells) to reserve for the rows ``held`` (running, or being chunk-prefilled)
    and ``prefill`` (this step's group, which also holds its own prefill cache): see the module doc.
    A row with ``n``/``best_of`` samples counts once per sample."""
    held, prefill = list(held), list(prefill)
    rows = sum(row.width for row in held) + sum(row.width for row in prefill)
    longest = max((final_length(row, max_model_len) for row in [*held, *prefill]), default=0)
    group = sum(row.width for row in prefill) * max((len(row.request.prompt_ids) for row in prefill), default=0)
    return rows * longest + group


def free_memory(device: Any) -> int | None:
    """Bytes free for new tensors on ``device``: on a GPU what CUDA reports free; on the CPU the
    kernel's ``MemAvailable``, capped by the cgroup's limit minus its usage when one is set (a
    container's limit is what the OOM killer enforces). None when it cannot be read."""
    if getattr(device, "type", str(device)).startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    available: int | None = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            room = int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            available = room if available is None else min(available, room)
    return available


def auto_budget(device: Any) -> int | None:
    """``option.kv_cache_memory_bytes=auto``: :data:`AUTO_SHARE` of :func:`free_memory` (None: unknown,
    no bound)."""
    free = free_memory(device)
    return None if free is None else max(0, int(free * AUTO_SHARE))


def kv_limit(option: int | None, device: Any, per_token: int) -> int | None:
    """The engine's bound from ``option.kv_cache_memory_bytes`` (None: ``auto``; 0: no bound), logged
    once at load with what it holds in tokens. Returns bytes, or None for no bound."""
    if option == 0:
        LOG.info("KV cache: no bound (option.kv_cache_memory_bytes=0); %d bytes per cached token", per_token)
        return None
    limit = auto_budget(device) if option is None else option
    how = f"auto: {AUTO_SHARE:g} of the memory free after loading" if option is None else "option.kv_cache_memory_bytes"
    if limit is None:
        LOG.info("KV cache: no bound (the free memory cannot be read); %d bytes per cached token", per_token)
        return None
    LOG.info("KV cache bound: %.2f GiB (%s), %d bytes per cached token: %d tokens", limit / 2**30, how, per_token,
             limit // max(1, per_token))
    return limit
