"""The Megatron actor's per-layer CUDA graphs (actor.model.cuda_graph_impl: transformer_engine):
captured, released, counted. What is graphed and refused: rlinf.config.megatron_graphs.

megatron-core 0.19.2's TECudaGraphHelper captures, on dummy inputs of one fixed [tokens, rows]
shape, one forward and one backward graph per decoder layer (at PP = 1 one pair serves every
micro-batch); a layer in training mode then replays its pair instead of running the graphed parts,
and the logprob pass (eval mode) runs eagerly.

The graphs hold the addresses of the weights and of DDP's main_grad buffer (the fused weight-grad
GEMMs write into it), and a memory pool of their own. An offload resizes those buffers' storage to
0 and the onload allocates new storage, so the graphs are released before every offload and
captured again at the next train call (`time/cuda_graph_capture` says what that costs).
"""

from __future__ import annotations

import time

import torch

from rlinf.config.megatron_graphs import TrainShape


def prepare_process(seed: int) -> None:
    """What megatron-core's capture needs of the process, before the model is built: Transformer
    Engine's graph-safe RNG tracker (Megatron-Bridge asserts it), and the microbatch calculator,
    whose count enters only TE's warm-up rule (cuda_graph_warmup_steps = 0 makes that 10 passes at
    the first capture; RECAPTURE_WARMUP_STEPS below, 1 at a recapture).
    The caller has set a side stream as the current one, as Megatron-LM and Megatron-Bridge do before
    a capture: the legacy default stream synchronises with every stream, which a capture forbids."""
    import torch.distributed as dist
    from megatron.core import tensor_parallel
    from megatron.core.num_microbatches_calculator import reconfigure_num_microbatches_calculator

    tensor_parallel.model_parallel_cuda_manual_seed(
        seed, te_rng_tracker=True, use_cudagraphable_rng=True, force_reset_rng=True
    )
    reconfigure_num_microbatches_calculator(
        rank=dist.get_rank(),
        rampup_batch_size=None,
        global_batch_size=1,
        micro_batch_size=1,
        data_parallel_size=1,
    )


def nccl_env_for_graphs(environ) -> None:
    """Before NCCL starts: megatron-core's capture asserts NCCL_GRAPH_REGISTER=0 when the caching
    allocator runs with expandable_segments:True (NCCL's registration of graph buffers then ends in an
    illegal memory access); set it, unless the environment already says otherwise."""
    if "expandable_segments:True" in environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        environ.setdefault("NCCL_GRAPH_REGISTER", "0")


# megatron-core's TE helper runs ceil((10 - cuda_graph_warmup_steps x micro-batches) / captured
# micro-batches) warm-up passes per layer, at least 1: "at least 10 per layer, counting the eager
# steps before the capture". A capture after an onload follows the first capture's warm-up in the
# same process, so it takes the minimum: one pass per layer instead of ten.
RECAPTURE_WARMUP_STEPS = 10


class TrainGraphs:
    """The graphs of a model's train pass: captured at the first train call after construction or an
    offload, released before an offload."""

    def __init__(self, model: list, optimizer, shape: TrainShape) -> None:
        self.model, self.optimizer, self.shape = model, optimizer, shape
        self._helper = None
        self._dispatchers = DispatcherState([])
        self.captures = 0  # how many times the graphs were captured

    @property
    def captured(self) -> bool:
        return self._helper is not None

    def ensure_captured(self) -> float:
        """Capture when none are held (the model in training mode); the seconds it took, 0 if held.
        The capture's warm-up passes accumulate grads; the helper zeroes the grad buffers after.
        Held graphs get the MoE dispatchers' Python-side state back first (DispatcherState)."""
        if self._helper is not None:
            self._dispatchers.restore()
            return 0.0
        from megatron.core.transformer.cuda_graphs import TECudaGraphHelper
        from megatron.core.utils import get_model_config

        started = time.perf_counter()
        calls = _layer_class_calls(self.model)
        config = get_model_config(self.model[0])
        warmup_steps = config.cuda_graph_warmup_steps
        if self.captures:  # a recapture: the first capture's warm-up passes count
            config.cuda_graph_warmup_steps = max(warmup_steps, RECAPTURE_WARMUP_STEPS)
        try:
            helper = TECudaGraphHelper(
                model=self.model,
                config=config,
                seq_length=self.shape.tokens,
                micro_batch_size=self.shape.rows,
                optimizers=[self.optimizer],
            )
            helper.create_cudagraphs()
        except BaseException:
            _undo_failed_capture(self.model, calls)
            raise
        finally:
            config.cuda_graph_warmup_steps = warmup_steps
        if not helper.graphs_created():
            raise RuntimeError(
                "actor.model.cuda_graph_modules: no decoder layer has a part to graph "
                f"({list(config.cuda_graph_modules)})"
            )
        # No cuda_graph_set_manual_hooks(): those hooks wait for DDP's overlapped parameter
        # all-gathers (overlap_param_gather), which rlinf keeps off; megatron's hook asserts it on.
        self._helper = helper
        self._dispatchers = DispatcherState(self.model)
        self.captures += 1
        return time.perf_counter() - started

    def release(self) -> None:
        """Free the graphs and their memory pool (before the buffers they point into move)."""
        if self._helper is None:
            return
        self._helper.delete_cuda_graphs()
        self._helper = None

    def graphed_modules(self) -> list:
        """The decoder layers holding graphs now (each keeps them in its `cuda_graphs` list)."""
        return [m for chunk in self.model for m in chunk.modules() if getattr(m, "cuda_graphs", None)]

    def graphed_layers(self) -> int:
        return len(self.graphed_modules())


class DispatcherState:
    """What each MoE token dispatcher keeps in Python attributes (not tensors: the hidden shape its
    combine step views the output as, token counts), as the capture left them. A replay hands the
    graphed preprocess's tensors back to the dispatcher (megatron-core's `cudagraph_attrs`), not
    these; an eager pass of another shape in between (the logprob pass: eval mode, trimmed
    micro-batches) overwrites them, and the next replay's combine then views its output in that
    shape. Put back before each train call that replays."""

    def __init__(self, model: list) -> None:
        self.saved = [
            (d, {name: value for name, value in vars(d).items() if not isinstance(value, torch.Tensor)})
            for d in _token_dispatchers(model)
        ]

    def restore(self) -> None:
        for dispatcher, attributes in self.saved:
            for name, value in attributes.items():
                setattr(dispatcher, name, value)


def _token_dispatchers(model: list) -> list:
    found = (getattr(m, "token_dispatcher", None) for chunk in model for m in chunk.modules())
    return [d for d in found if d is not None]


_ABSENT = object()


def _layer_class_calls(model: list) -> dict:
    """The `__call__` each graphable layer class defines itself (or _ABSENT): TE's
    make_graphed_callables wraps it for the capture and puts it back only when the capture ends."""
    classes = {type(m) for chunk in model for m in chunk.modules() if hasattr(m, "cuda_graphs")}
    return {cls: cls.__dict__.get("__call__", _ABSENT) for cls in classes}


def _undo_failed_capture(model: list, calls: dict) -> None:
    """What a capture that raised leaves behind, undone so that the process can go on (the next
    actor of a test, a retry): megatron-core's and TE's "capturing" flags (megatron's DDP skips
    every backward hook while its flag is set: eager actors would then lose the gradients that
    are not fused into main_grad, silently), TE's wrapper of the layer classes' `__call__`, a
    frozen garbage collector, and any graph handed to a layer."""
    import gc

    from megatron.core.transformer import cuda_graphs as mcore_graphs

    from rlinf.models.megatron import te_placeholder

    mcore_graphs._set_capture_end()
    if getattr(mcore_graphs, "FREEZE_GC", False):
        gc.unfreeze()
    if te_placeholder.real_te_available():  # without TE (or with its placeholder) nothing to undo
        from transformer_engine.pytorch import graph as te_graph

        if hasattr(te_graph, "set_capture_end"):
            te_graph.set_capture_end()
    for cls, call in calls.items():
        if call is _ABSENT:
            if "__call__" in cls.__dict__:
                delattr(cls, "__call__")
        else:
            cls.__call__ = call
    for chunk in model:
        for m in chunk.modules():
            if getattr(m, "cuda_graphs", None):
                m.cuda_graphs = []


def rng_states_like(current: dict, saved: dict) -> dict:
    """`saved` tracker states in the form of this process's tracker: Transformer Engine's graph-safe
    tracker keeps torch.Generator objects, megatron's eager one byte tensors, so a checkpoint written
    with the graphs on resumes with them off, and the other way round. A generator of this process
    takes the saved state in place: captured graphs hold the generators they were captured with."""
    out = {}
    for name, state in saved.items():
        mine = current.get(name)
        if isinstance(mine, torch.Generator):
            mine.set_state(state.get_state() if isinstance(state, torch.Generator) else state)
            out[name] = mine
        elif isinstance(state, torch.Generator):
            out[name] = state.get_state()
        else:
            out[name] = state
    return out
