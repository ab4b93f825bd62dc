"""``KVBatch`` / ``SlabLayer`` (the HF engine's running batch), on small hand-made tensors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from djl_handlers.engines.hf.batch import GROW, KVBatch, SlabLayer, left_pad, pad_left  # noqa: E402


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
    ("keep", "columns"),
    [
        ([0, 2], [1, 2, 3]),  # column 0 is padding for both: trimmed
        ([1], [0, 1, 2, 3]),
        ([2, 0], [1, 2, 3]),
        ([0, 1, 2], [0, 1, 2, 3]),  # nothing dropped: nothing changes
    ],
)
def test_select_keeps_rows_and_trims_common_padding(keep: list[int], columns: list[int]) -> None:
    masks = [[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]]
    batch, keys = _batch(masks)
    batch.select(keep)
    assert sorted(batch.rows) == sorted(keep)  # the order may change: rows move into holes
    for p, r in enumerate(batch.rows):  # every per-row tensor stays aligned with the cache row
        assert batch.mask[p].tolist() == [masks[r][c] for c in columns]
        assert torch.equal(batch.cache.layers[0].keys[p], keys[r][:, columns])
        assert batch.pending[p].item() == r and batch.pos[p].item() == sum(masks[r])


def test_select_copies_only_the_rows_that_move() -> None:
    batch, keys = _batch([[1, 1]] * 5)
    layer = batch.cache.layers[0]
    slab = layer._k  # noqa: SLF001
    batch.select([0, 2, 4])  # row 4 moves into the hole of row 1; the slab is not reallocated
    assert layer._k is slab and batch.rows == [0, 4, 2]  # noqa: SLF001
    assert torch.equal(layer.keys, keys[[0, 4, 2]])


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


def test_merge_of_a_longer_prompt_grows_the_batch_on_the_left() -> None:
    batch, keys = _batch([[1, 1]])
    other, other_keys = _batch([[1, 1, 1, 1]], start=100)
    batch.merge(other)
    assert batch.mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    merged = batch.cache.layers[0].keys
    assert merged[0, 0, :, 0].tolist() == [0.0, 0.0, 0.0, 1.0] and torch.equal(merged[1:], other_keys)
    assert torch.equal(batch.cache.layers[0].values, -merged)


def _joining(reference: dict[int, list[float]], first_id: int, lengths: list[int]) -> KVBatch:
    """A freshly prefilled group: row ``first_id + i`` holds ``lengths[i]`` keys, right-aligned."""
    width, n = max(lengths), len(lengths)
    keys = torch.zeros(n, 1, width, 1)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, length in enumerate(lengths):
        values = [float((first_id + i) * 1000 + c) for c in range(length)]
        reference[first_id + i] = values
        keys[i, 0, width - length :, 0] = torch.tensor(values)
        mask[i, width - length :] = 1
    layer = SlabLayer()
    layer.adopt(keys, -keys)
    rows = list(range(first_id, first_id + n))
    return KVBatch(SimpleNamespace(layers=[layer]), mask, mask.sum(dim=1), torch.zeros(n), rows)


def _check(batch: KVBatch, reference: dict[int, list[float]]) -> None:
    keys, values = batch.cache.layers[0].views()
    assert sorted(batch.rows) == sorted(reference) and keys.shape[-2] == batch.width
    assert bool(batch.mask.any(dim=0)[0])  # common left padding is trimmed
    for p, r in enumerate(batch.rows):
        length = len(reference[r])
        assert batch.mask[p].tolist() == [0] * (batch.width - length) + [1] * length
        assert keys[p, 0, batch.width - length :, 0].tolist() == reference[r]
        assert torch.equal(values[p], -keys[p])
        assert not bool(keys[p, 0, : batch.width - length].ne(0).any())  # padding is zeros


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["join", "leave", "decode"]), st.integers(1, 6), st.integers(0, 2**16)),
                min_size=1, max_size=25))
def test_joins_leaves_and_decodes_keep_every_row_intact(ops: list[tuple[str, int, int]]) -> None:
    """Against a plain list of each row's keys: after any sequence of joins (prompts of any
    length), leaves (any subset) and decode steps, each row's real columns hold exactly its own
    keys and values, the mask marks them right-aligned, and no column is padding for every row."""
    reference: dict[int, list[float]] = {}  # row id -> its keys, oldest first
    batch: KVBatch | None = None
    next_id = 0
    for op, n, seed in ops:
        if op == "join":
            lengths = [int(x) for x in torch.randint(1, 9, (n,), generator=torch.Generator().manual_seed(seed))]
            new = _joining(reference, next_id, lengths)
            next_id += n
            if batch is None:
                batch = new
            else:
                batch.merge(new)
        elif batch is not None and op == "leave":
            keep = [i for i in range(len(batch.rows)) if (seed >> (i % 16)) & 1]
            if not keep:
                continue
            for i in set(range(len(batch.rows))) - set(keep):
                reference.pop(batch.rows[i])
            batch.select(keep)
        elif batch is not None and op == "decode":
            batch.grow_mask()
            column = torch.tensor([float(-(r + 1) * 7 - len(reference[r])) for r in batch.rows]).view(-1, 1, 1, 1)
            batch.cache.layers[0].update(column, -column)
            for r, value in zip(batch.rows, column.flatten().tolist(), strict=True):
                reference[r].append(value)
        if batch is not None:
            _check(batch, reference)
