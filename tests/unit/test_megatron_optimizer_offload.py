"""rlinf.models.megatron.optimizer_offload: only tensors that own their storage move; views into
the model's parameter buffer (the precision-aware optimizer's params) stay where the buffer is."""

from types import SimpleNamespace

import torch

from rlinf.models.megatron.optimizer_offload import owned_tensors


def distributed_optimizer():
    buffer = torch.arange(10.0)  # the DDP parameter buffer: the model's weights
    view = buffer[2:5]  # a precision-aware optimizer param: a shard of the model's own weights
    master = torch.ones(3)  # an fp32 master shard (owns its memory)
    state = {view: {"exp_avg": torch.zeros(3), "master_param": torch.full((3,), 7, dtype=torch.int16)}}
    inner = SimpleNamespace(param_groups=[{"params": [view, master]}], state=state)
    return SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=inner)]), buffer, view, master


def test_owned_tensors_move_and_views_into_the_parameter_buffer_stay():
    optimizer, buffer, view, master = distributed_optimizer()
    inner = optimizer.chained_optimizers[0].optimizer
    moving = list(owned_tensors(optimizer))
    assert [t for t, _ in moving] == [master, *inner.state[view].values()]
    for tensor, put in moving:  # what a move to another device does, on the CPU
        put(tensor.clone().fill_(-1))
    assert (master == -1).all() and all((v == -1).all() for v in inner.state[view].values())
    assert view._base is buffer and view.tolist() == [2.0, 3.0, 4.0]
    buffer[3] = 100.0  # the optimizer still updates (and sees) the model's weights
    assert inner.param_groups[0]["params"][0][1].item() == 100.0
