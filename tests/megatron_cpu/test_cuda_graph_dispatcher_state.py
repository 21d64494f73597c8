"""Held CUDA graphs get the MoE token dispatchers' Python-side state back before a train call
(rlinf.models.megatron.cuda_graphs.DispatcherState), in megatron-core on the CPU (fp32, one gloo
rank; the capture is faked, graphs need a GPU and TE):

a replay hands the graphed preprocess's tensors back to the dispatcher, not its Python attributes;
the logprob pass between two train calls (eval mode, trimmed micro-batches) leaves its own hidden
shape there, and the next replay's combine step would view its output in that shape (seen on an
H100: "The size of tensor a (20) must match the size of tensor b (32)").
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh agentic ...)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from actor_on_cpu import build_actor, varied_batch  # noqa: E402
from megatron.core.transformer import cuda_graphs as mcore_graphs  # noqa: E402

from rlinf.algorithms import LossNormalizer  # noqa: E402
from rlinf.config.megatron_graphs import TrainShape  # noqa: E402
from rlinf.models.megatron.cuda_graphs import TrainGraphs  # noqa: E402
from rlinf.workers.actor.policy_update import _loss_fn  # noqa: E402

SHAPE = TrainShape(rows=4, tokens=32)  # varied_batch: prompts of up to 9 tokens, responses of up to 11


class HeldGraphs:
    """Stands for TE's helper after a capture: nothing to run, graphs reported held."""

    def __init__(self, model, **_kwargs) -> None:
        self.model = model

    def create_cudagraphs(self) -> None:
        pass

    def graphs_created(self) -> bool:
        return True

    def delete_cuda_graphs(self) -> None:
        pass


def hidden_shapes(actor) -> list:
    return [
        m.token_dispatcher.hidden_shape
        for m in actor.model[0].modules()
        if getattr(m, "token_dispatcher", None) is not None
    ]


def test_a_replayed_train_call_sees_the_dispatchers_as_the_capture_left_them(
    on_cpu, cuda_device_is_cpu, tiny_megatron_checkpoint, monkeypatch
):
    monkeypatch.setattr(mcore_graphs, "TECudaGraphHelper", HeldGraphs)
    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32")
    batch = varied_batch()
    with torch.no_grad():
        logprobs, _ = actor._logprobs(actor.model[0], batch)
    batch = replace(batch, old_logprobs=(logprobs - 0.05) * batch.response_mask)
    micros = [batch.select([0, 1, 2]).trimmed()]
    # the train pass at the graphs' shape, then the "capture" records the dispatchers' state
    actor.model[0].train()
    actor.train_shape = SHAPE
    normalizer = LossNormalizer.from_masks([m.response_mask for m in micros])
    actor.forward_backward(micros, _loss_fn(actor, actor.cfg.algorithm, normalizer))
    graphs = TrainGraphs(actor.model, actor.optimizer, SHAPE)
    graphs.ensure_captured()
    captured = hidden_shapes(actor)
    assert captured and all(s[0] == SHAPE.tokens and s[1] == SHAPE.rows for s in captured), captured

    with torch.no_grad():  # the logprob pass: eval mode, trimmed micro-batches
        actor._logprobs(actor.model[0], batch.select([3, 4]).trimmed())
    assert hidden_shapes(actor) != captured  # the eager pass left its own shape

    assert graphs.ensure_captured() == 0.0  # held: no capture, the state put back
    assert hidden_shapes(actor) == captured
