"""``KVBatch`` / ``SlabLayer`` (the HF engine's running batch), on small hand-made tensors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from djl_handlers.engines.hf_batch import GROW, KVBatch, SlabLayer, left_pad, pad_left  # noqa: E402


def _batch(masks: list[list[int]], start: int = 0) -> tuple[KVBatch, Any]:
    """A one-layer batch whose key at (row, column) is ``start + 10*row + column``."""
    rows, width = len(masks), len(masks[0])
    keys = torch.tensor([[float(start + 10 * r + c) for c in range(width)] for r in range(rows)])
    keys = keys.view(rows, 1, width, 1)
    layer = SlabLayer()
    layer.adopt(keys, -keys)
    mask = torch.tensor(masks)
    batch = KVBatch(SimpleNamespace(layers=[layer]), mask, mask.sum(dim=1), torch.arange(rows), list(range(rows)))
    return batch, keys


def test_slab_grows_in_place_and_keeps_room() -> None:
    batch, keys = _batch([[1, 1]])
    layer = batch.cache.layers[0]
    new = torch.full((1, 1, 1, 1), 7.0)
    out_k, out_v = layer.update(new, -new)
    assert out_k.shape[-2] == 3 and out_k[0, 0, :, 0].tolist() == [0.0, 1.0, 7.0]
    assert torch.equal(out_v, -out_k) and layer._k.shape[-2] == 2 + GROW  # noqa: SLF001


@pytest.mark.parametrize(
    ("keep", "mask", "columns"),
    [
        ([0, 2], [[0, 1, 1], [1, 1, 1]], [1, 2, 3]),  # column 0 is padding for both: trimmed
        ([1], [[1, 1, 1, 1]], [0, 1, 2, 3]),
        ([2, 0], [[1, 1, 1], [0, 1, 1]], [1, 2, 3]),  # order follows ``keep``
    ],
)
def test_select_keeps_rows_and_trims_common_padding(keep: list[int], mask: list[list[int]], columns: list[int]) -> None:
    batch, keys = _batch([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]])
    batch.select(keep)
    assert batch.mask.tolist() == mask and batch.rows == keep
    expected = keys[keep][:, :, columns]
    assert torch.equal(batch.cache.layers[0].keys, expected)
    assert batch.pending.tolist() == keep


def test_merge_left_pads_the_narrower_side() -> None:
    batch, keys = _batch([[1, 1]])
    other, other_keys = _batch([[0, 1, 1]], start=100)
    batch.merge(other)
    assert batch.width == 3 and batch.mask.tolist() == [[0, 1, 1], [0, 1, 1]]
    merged = batch.cache.layers[0].keys
    assert merged[0, 0, :, 0].tolist() == [0.0, 0.0, 1.0]  # zero-padded on the left
    assert torch.equal(merged[1:], other_keys)
    assert batch.pos.tolist() == [2, 2] and len(batch.rows) == 2


def test_padding_helpers() -> None:
    ids, mask = left_pad([[5], [6, 7, 8], []], pad_id=0)
    assert ids.tolist() == [[0, 0, 5], [6, 7, 8], [0, 0, 0]] and mask.tolist() == [[0, 0, 1], [1, 1, 1], [0, 0, 0]]
    assert pad_left(torch.ones(1, 2), 4, 1).tolist() == [[0.0, 0.0, 1.0, 1.0]]
