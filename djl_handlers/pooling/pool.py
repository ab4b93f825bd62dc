"""Pooling of a batch's last hidden states into one vector per text, as sentence-transformers'
``Pooling`` module computes it (``mean``, ``cls``, ``max``, ``mean_sqrt_len``, ``lasttoken``), and
the L2 normalisation of its ``Normalize`` module. torch is imported by the caller (the engine)."""

from __future__ import annotations

from typing import Any

__all__ = ["l2_normalize", "pool"]


def pool(hidden: Any, mask: Any, mode: str) -> Any:
    """``hidden`` [batch, tokens, dim] and ``mask`` [batch, tokens] (1 for real tokens) → [batch, dim].

    Padding may sit on either side: ``cls`` takes each row's first real token, ``lasttoken`` its last."""
    import torch

    weights = mask.to(hidden.dtype).unsqueeze(-1)
    if mode in ("mean", "mean_sqrt_len"):
        summed = (hidden * weights).sum(dim=1)
        counts = weights.sum(dim=1).clamp(min=1e-9)
        return summed / (counts if mode == "mean" else torch.sqrt(counts))
    if mode == "max":
        filled = hidden.masked_fill(weights == 0, torch.finfo(hidden.dtype).min)
        return filled.max(dim=1).values
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    real = mask.bool()
    if mode == "cls":
        first = torch.where(real, positions, mask.shape[1]).min(dim=1).values
        return hidden[rows, first]
    if mode == "lasttoken":
        last = torch.where(real, positions, -1).max(dim=1).values
        return hidden[rows, last]
    raise ValueError(f"unknown pooling mode {mode!r}")


def l2_normalize(vectors: Any) -> Any:
    """Each row scaled to unit length (torch's ``normalize``: rows of zeros stay zeros)."""
    import torch

    return torch.nn.functional.normalize(vectors, p=2, dim=1)
