"""rlinf.workers.actor.staging: many host tensors reach the device as views of one buffer moved in
one copy, with their dtypes, shapes and values; metric scalars come back in one read."""

import pytest
import torch

from rlinf.workers.actor.staging import scalars_to_host, to_device_once


def test_tensors_of_every_dtype_and_shape_arrive_as_views_of_one_buffer():
    tensors = [
        torch.tensor([True, False, True]),
        None,
        torch.arange(6).reshape(2, 3),  # int64 after a 3-byte bool: needs the alignment
        torch.tensor(2.5),  # 0-d
        torch.randn(5).to(torch.bfloat16),
        torch.zeros(0, 4),
        torch.randn(4, 3).t(),  # not contiguous
        torch.tensor([1, 2, 3], dtype=torch.int32),
    ]
    moved = to_device_once(tensors, torch.device("cpu"))
    assert moved[1] is None
    storages = set()
    for got, want in zip(moved, tensors, strict=True):
        if want is None:
            continue
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        storages.add(got.untyped_storage().data_ptr())
    assert len(storages) == 1, "one buffer, one copy"
    tensors[0][0] = False
    assert bool(moved[0][0]), "the results alias their inputs"


def test_the_host_buffer_is_pinned_only_for_a_gpu(monkeypatch):
    pinned = []
    empty = torch.empty

    def recording(*args, **kwargs):
        pinned.append(kwargs.get("pin_memory", False))
        return empty(*args, **{k: v for k, v in kwargs.items() if k != "pin_memory"})

    monkeypatch.setattr(torch, "empty", recording)
    to_device_once([torch.ones(3)], torch.device("cpu"))
    assert pinned == [False]


def test_metric_scalars_come_back_in_one_read_with_their_float_values(monkeypatch):
    dicts = [
        {
            "loss": torch.tensor(0.1, dtype=torch.float32),
            "count": torch.tensor(3),
            "flag": torch.tensor(True),
        },
        {"loss": torch.tensor(1 / 3, dtype=torch.float64), "plain": 0.25},
    ]
    expected = [{k: float(v) for k, v in d.items()} for d in dicts]
    reads = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(1) or tolist(self))
    monkeypatch.setattr(torch.Tensor, "__float__", lambda self: pytest.fail("a float() read per value"))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("an item() read per value"))
    assert scalars_to_host(dicts) == expected
    assert len(reads) == 1
    assert scalars_to_host([{"plain": 1.0}]) == [{"plain": 1.0}]
