"""A CUDA graph capture that raises (rlinf.models.megatron.cuda_graphs.TrainGraphs) leaves the
process as it found it, in megatron-core on the CPU (the capture itself is faked: graphs need a GPU
and TE):

- megatron-core's "capturing" flag is down again: while it is up, megatron's DDP skips every
  backward hook, so every later eager actor of the process (the GPU test's next case) would lose
  the gradients that are not fused into main_grad, silently;
- the layer class's `__call__`, which TE's make_graphed_callables wraps during a capture, is
  megatron's again; no layer holds a graph; the error reaches the caller.
"""

from __future__ import annotations

import importlib.util
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


class Layer(torch.nn.Module):
    """Stands for a graphable decoder layer: megatron-core gives those a `cuda_graphs` list."""

    def __init__(self) -> None:
        super().__init__()
        self.cuda_graphs: list = []


class Chunk(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(cuda_graph_warmup_steps=0)  # what get_model_config finds
        self.layers = torch.nn.ModuleList([Layer(), Layer()])


class FailingHelper:
    """Fails as a capture can, half-way: the flags up, the layer class wrapped, a graph handed out."""

    def __init__(self, model, **_kwargs) -> None:
        self.model = model

    def create_cudagraphs(self) -> None:
        mcore_graphs._set_capture_start()
        Layer.__call__ = lambda self, *args, **kwargs: None  # as TE's autocast wrapper does
        self.model[0].layers[0].cuda_graphs = ["half-made graph"]
        raise RuntimeError("capture failed")


def test_a_failed_capture_puts_the_flags_and_the_layers_back(monkeypatch):
    monkeypatch.setattr(mcore_graphs, "TECudaGraphHelper", FailingHelper)
    model = [Chunk()]
    graphs = TrainGraphs(model, optimizer=None, shape=TrainShape(rows=1, tokens=8))
    with pytest.raises(RuntimeError, match="capture failed"):
        graphs.ensure_captured()
    assert not mcore_graphs.is_graph_capturing()
    assert "__call__" not in Layer.__dict__  # megatron's (here torch's) __call__ again
    assert all(not layer.cuda_graphs for layer in model[0].layers)
    assert not graphs.captured and graphs.captures == 0
