"""A padding-free forward of BERT-family encoders: the texts of a batch laid end to end.

transformers runs a batch padded to its longest text: every linear layer, the GELU and the layer
norms also run over the padding, and attention over a masked square per row. Here the batch's tokens
are one ``[1, tokens, hidden]`` sequence: the model's own embedding, projection, output and
feed-forward modules (all token-wise) run on it as they are, each text's positions restart at 0, and
only attention is computed apart, per text (``scaled_dot_product_attention`` over that text's tokens,
no mask). Pooling then reads each text's slice (:func:`~djl_handlers.pooling.pool.pool` on one row).

Which models: :func:`check` accepts an encoder whose modules have BERT's layout
(``embeddings`` taking ``position_ids``; ``encoder.layer[i]`` with ``attention.self.query/key/value``,
``attention.output``, ``intermediate``, ``output``), absolute positions, not a decoder and no
cross-attention; ``model_type`` ``bert`` (positions from 0) or ``roberta``/``xlm-roberta`` (positions
from ``padding_idx + 1``). The engine then compares this forward with the model's own padded forward
on two texts at load and keeps the padded forward when they differ (:func:`agrees`). torch is imported
inside functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

__all__ = ["PackedEncoder", "agrees", "check"]

#: ``model_type`` → the first position id of a text (RoBERTa counts from ``padding_idx + 1``).
_POSITION_START = {"bert": None, "roberta": "padding", "xlm-roberta": "padding"}
#: The least cosine similarity between the packed and the padded forward's pooled vectors at load.
AGREE_COSINE = 0.999999


def check(model: Any) -> Optional[str]:
    """None when ``model`` has the layout :class:`PackedEncoder` runs, else why not."""
    config = getattr(model, "config", None)
    model_type = str(getattr(config, "model_type", ""))
    if model_type not in _POSITION_START:
        return f"model_type {model_type!r} is not one of {', '.join(sorted(_POSITION_START))}"
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "a decoder or cross-attention configuration"
    if str(getattr(config, "position_embedding_type", "absolute") or "absolute") != "absolute":
        return f"position_embedding_type={getattr(config, 'position_embedding_type', None)!r} (only absolute)"
    if getattr(model, "training", False):
        return "the model is in training mode"
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if not hasattr(model, "embeddings") or not layers:
        return "no embeddings or encoder.layer modules"
    for layer in layers:
        attention = getattr(layer, "attention", None)
        inner = getattr(attention, "self", None)
        if inner is None or not all(hasattr(inner, n) for n in ("query", "key", "value", "num_attention_heads",
                                                                  "attention_head_size")):
            return "an encoder layer without BERT's attention.self.query/key/value"
        if not all(hasattr(layer, n) for n in ("intermediate", "output")) or not hasattr(attention, "output"):
            return "an encoder layer without BERT's intermediate/output modules"
    return None


class PackedEncoder:
    """Runs ``model`` (accepted by :func:`check`) on texts laid end to end (see the module docstring)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.layers = list(model.encoder.layer)
        start = _POSITION_START[str(model.config.model_type)]
        self.first_position = 0 if start is None else int(model.embeddings.padding_idx) + 1

    def hidden(self, items: Sequence[dict[str, list[int]]]) -> tuple[Any, list[int]]:
        """The last hidden states ``[tokens, hidden]`` of ``items`` end to end, and each text's length."""
        import torch

        lengths = [len(item["input_ids"]) for item in items]
        ids = torch.tensor([t for item in items for t in item["input_ids"]], dtype=torch.long)
        positions = torch.cat([torch.arange(self.first_position, self.first_position + n) for n in lengths])
        types = None
        if "token_type_ids" in items[0]:
            types = torch.tensor([t for item in items for t in item["token_type_ids"]], dtype=torch.long)[None]
        device = next(self.model.parameters()).device
        hidden = self.model.embeddings(input_ids=ids[None].to(device), position_ids=positions[None].to(device),
                                       token_type_ids=None if types is None else types.to(device))
        for layer in self.layers:
            hidden = self._layer(layer, hidden, lengths)
        return hidden[0], lengths

    @staticmethod
    def _layer(layer: Any, hidden: Any, lengths: list[int]) -> Any:
        """One encoder layer on ``hidden`` ``[1, tokens, dim]``: attention per text, the rest token-wise."""
        import torch
        from torch.nn.functional import scaled_dot_product_attention

        inner = layer.attention.self
        heads, size = int(inner.num_attention_heads), int(inner.attention_head_size)
        shape = (hidden.shape[1], heads, size)
        query = inner.query(hidden).view(shape).transpose(0, 1)  # [heads, tokens, size]
        key = inner.key(hidden).view(shape).transpose(0, 1)
        value = inner.value(hidden).view(shape).transpose(0, 1)
        context = torch.empty(shape, dtype=hidden.dtype, device=hidden.device)
        start = 0
        for n in lengths:
            end = start + n
            out = scaled_dot_product_attention(query[None, :, start:end], key[None, :, start:end],
                                               value[None, :, start:end], scale=getattr(inner, "scaling", None))
            context[start:end] = out[0].transpose(0, 1)
            start = end
        attended = layer.attention.output(context.view(1, shape[0], heads * size), hidden)
        return layer.output(layer.intermediate(attended), attended)


def agrees(packed: PackedEncoder, padded: Any, tokenizer: Any, pooling: str) -> bool:
    """True when the packed forward pools what the model's own padded forward pools, on two texts of
    different lengths (cosine of each pair of vectors at least :data:`AGREE_COSINE`)."""
    import torch

    from djl_handlers.pooling.pool import pool

    texts = ["A packed forward is checked against the padded one.", "Two texts, two lengths."]
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    keep = ("input_ids", "token_type_ids", "attention_mask")
    device = next(padded.parameters()).device
    with torch.inference_mode():
        reference = pool(padded(**{k: v.to(device) for k, v in encoded.items() if k in keep}).last_hidden_state,
                         encoded["attention_mask"].to(device), pooling).float()
        items = [{k: [int(t) for t, m in zip(encoded[k][i], encoded["attention_mask"][i], strict=True) if m]
                  for k in ("input_ids", "token_type_ids") if k in encoded} for i in range(len(texts))]
        hidden, lengths = packed.hidden(items)
        rows = pool_packed(hidden, lengths, pooling).float()
    cosine = torch.nn.functional.cosine_similarity(rows, reference, dim=1)
    return bool(torch.isfinite(cosine).all() and cosine.min() >= AGREE_COSINE)


def pool_packed(hidden: Any, lengths: list[int], mode: str) -> Any:
    """Pool each text's slice of ``hidden`` ``[tokens, dim]`` → ``[texts, dim]``."""
    import torch

    from djl_handlers.pooling.pool import pool

    if mode == "mean":
        sums = torch.segment_reduce(hidden, "sum", lengths=torch.tensor(lengths, device=hidden.device), axis=0)
        return sums / torch.tensor(lengths, dtype=hidden.dtype, device=hidden.device)[:, None]
    rows, start = [], 0
    for n in lengths:
        segment = hidden[start:start + n]
        rows.append(pool(segment[None], torch.ones(1, n, dtype=torch.long, device=hidden.device), mode)[0])
        start += n
    return torch.stack(rows)
