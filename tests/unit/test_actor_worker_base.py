"""What every actor backend inherits from rlinf.workers.actor.base.ActorWorker."""

import torch

from rlinf.workers.actor.base import ActorWorker


class TwoWeights(ActorWorker):
    """Only what the base class needs to run its own verbs; counts the passes over the weights."""

    def __init__(self) -> None:
        self.passes = 0

    def device_weights(self):
        self.passes += 1
        yield "a.weight", torch.ones(4)
        yield "b.weight", torch.zeros(2, dtype=torch.bfloat16)

    dp_info = policy_logprobs = update_policy = export_weights = save = None  # type: ignore[assignment]
    load = export_hf = offload = onload = None  # type: ignore[assignment]


def sync(actor: ActorWorker) -> list[list[str]]:
    actor.weight_export("begin", 1024)
    layouts = []
    while (layout := actor.weight_export("next_bucket")) is not None:
        layouts.append([t.name for t in layout.tensors])
    actor.weight_export("end")
    return layouts


def test_weight_export_streams_the_backends_device_weights_with_one_exporter_per_actor():
    actor = TwoWeights()
    assert sync(actor) == [["a.weight", "b.weight"]]
    exporter = actor._weight_exporter
    assert sync(actor) == [["a.weight", "b.weight"]]
    assert actor._weight_exporter is exporter  # kept: it holds the NCCL group between syncs
    assert actor.passes == 2  # a fresh pass per sync
