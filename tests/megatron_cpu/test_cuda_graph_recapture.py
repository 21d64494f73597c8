"""A capture after an onload takes megatron-core's minimum of warm-up passes
(rlinf.models.megatron.cuda_graphs.RECAPTURE_WARMUP_STEPS), in megatron-core on the CPU (TE's
helper faked: graphs need a GPU and TE):

megatron-core's helper runs ceil((10 - cuda_graph_warmup_steps x micro-batches) / captured
micro-batches) warm-up passes per layer, at least one. The first capture runs its ten; a recapture,
after the first capture's warm-up in the same process, runs one; the model config is left as it
was, before and after each.
"""

from __future__ import annotations

import importlib.util
import math
from types import SimpleNamespace

import pytest
import torch

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh agentic ...)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from megatron.core.transformer import cuda_graphs as mcore_graphs  # noqa: E402

from rlinf.config.megatron_graphs import TrainShape  # noqa: E402
from rlinf.models.megatron.cuda_graphs import TrainGraphs  # noqa: E402

MICRO_BATCHES = 4  # what megatron's microbatch calculator would report


class Chunk(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(cuda_graph_warmup_steps=0, cuda_graph_modules=["attn"])


class WarmupRecorder:
    """Stands for TE's helper: records the warm-up passes per layer megatron-core's formula gives
    for the config it is handed (one captured micro-batch at PP = 1)."""

    passes: list[int] = []

    def __init__(self, model, config, **_kwargs) -> None:
        self.config = config

    def create_cudagraphs(self) -> None:
        steps = self.config.cuda_graph_warmup_steps
        WarmupRecorder.passes.append(max(1, math.ceil(10 - steps * MICRO_BATCHES)))

    def graphs_created(self) -> bool:
        return True

    def delete_cuda_graphs(self) -> None:
        pass


def test_a_recapture_runs_one_warm_up_pass_per_layer_the_first_ten(monkeypatch):
    monkeypatch.setattr(mcore_graphs, "TECudaGraphHelper", WarmupRecorder)
    WarmupRecorder.passes = []
    model = [Chunk()]
    graphs = TrainGraphs(model, optimizer=None, shape=TrainShape(rows=1, tokens=8))
    for _ in range(3):  # capture, then offload / onload twice
        graphs.ensure_captured()
        assert model[0].config.cuda_graph_warmup_steps == 0
        graphs.release()
    assert WarmupRecorder.passes == [10, 1, 1]
    assert graphs.captures == 3
