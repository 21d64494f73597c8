"""Production actor: a megatron-core model built by Megatron-Bridge from the HF checkpoint.

One Ray worker per actor GPU; it joins the process group itself, then megatron's model-parallel
groups (TP, PP, EP, ETP, CP from the recipe; DP is what is left). Logprobs and the GRPO update run
through the backend-agnostic loop of rlinf.workers.actor.policy_update with megatron's
forward_backward schedule and distributed optimizer; weights leave through Megatron-Bridge's HF
export, and checkpoints are megatron dist-checkpoints (every rank writes its shard). docs/megatron.md
describes the layer specs, precision and offload.
"""

from __future__ import annotations

import logging
import math
import os

import torch

from rlinf.algorithms.lr_schedule import lr_multiplier_from_config
from rlinf.config.schema import Config
from rlinf.data.batch import RolloutBatch
from rlinf.workers.actor.base import ActorWorker, WeightBucket
from rlinf.workers.actor.megatron_forward import MegatronForward
from rlinf.workers.actor.megatron_state import MegatronActorState
from rlinf.workers.actor.policy_update import (
    DPInfo,
    LossFn,
    PolicyUpdateBackend,
    SkipCounter,
    UpdateSettings,
    logprobs_in_row_order,
    micro_batch_rows,
    run_policy_update,
)

logger = logging.getLogger(__name__)


def _set_default_dist_env(rank: int, world_size: int) -> None:
    """Direct construction (tests, benchmarks): one process, rendezvous on localhost."""
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")


class MegatronActor(MegatronForward, MegatronActorState, ActorWorker, PolicyUpdateBackend):
    INITS_PROCESS_GROUP = True

    def __init__(self, cfg: Config, *, rank: int = 0, world_size: int = 1, device: str = "cuda") -> None:
        """`device="cpu"` joins a gloo group instead of NCCL: only for the multi-process CPU tests
        (tests/megatron_cpu/many_ranks.py), which also put megatron-core's CUDA calls on the CPU."""
        import torch.distributed as dist

        from rlinf.config.megatron_graphs import fixed_train_shape, graphs_on, routing_replay_problem
        from rlinf.config.megatron_settings import translate
        from rlinf.models.megatron import te_placeholder
        from rlinf.models.tiny import resolve_model_path

        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("actor.training_backend=megatron needs a CUDA GPU (none visible)")
        if cfg.algorithm.kl_beta > 0:
            raise ValueError(
                "algorithm.kl_beta > 0: the megatron actor has no reference model yet; use kl_beta: 0 "
                "(GRPO with a clipped ratio needs none) or the torch actor"
            )
        if problem := routing_replay_problem(cfg):
            raise ValueError(problem)
        self.cfg = cfg
        self.graphs_on = graphs_on(cfg.actor.model)
        _set_default_dist_env(rank, world_size)
        if device == "cuda":
            # Ray shows each rank one GPU; under torchrun every GPU is visible and LOCAL_RANK picks one.
            index = int(os.environ.get("LOCAL_RANK", "0")) if torch.cuda.device_count() > 1 else 0
            torch.cuda.set_device(index)
            self.device = torch.device("cuda", index)
            if self.graphs_on:  # captures need a stream other than the legacy default one
                from rlinf.models.megatron.cuda_graphs import nccl_env_for_graphs

                nccl_env_for_graphs(os.environ)
                torch.cuda.set_stream(torch.cuda.Stream())
            if not dist.is_initialized():
                dist.init_process_group(backend="nccl", device_id=self.device)
        else:
            self.device = torch.device("cpu")
            if not dist.is_initialized():
                dist.init_process_group(backend="gloo")

        # Before any megatron import: megatron-core decides whether TE is there when first imported.
        self.te_available = not te_placeholder.install()
        self.megatron_settings = translate(cfg.actor, te_available=self.te_available)
        for warning in self.megatron_settings.warnings:
            logger.warning(warning)
        self._init_parallel_state()
        if dist.get_rank() == 0:
            from rlinf.models.megatron.bridge import announce_spec

            self.spec = announce_spec(
                self.megatron_settings,
                self.te_available,
                cfg.runner.logger.log_path,
                cfg.actor.model.precision,
            )
        self._build_model(resolve_model_path(cfg.actor.model.model_path))
        self._install_routing_replay()
        self._build_optimizer()
        self.train_shape = fixed_train_shape(cfg.actor)  # every training micro-batch's, with graphs
        self.graphs = None
        if self.train_shape is not None:
            from rlinf.models.megatron.cuda_graphs import TrainGraphs

            self.graphs = TrainGraphs(self.model, self.optimizer, self.train_shape)
        self.settings = UpdateSettings.from_config(cfg)
        self.skips = SkipCounter()
        self.optimizer_steps = 0
        self.lr_at = lr_multiplier_from_config(cfg)
        self._conversion_tasks = None
        self.offloaded = False

    # --- construction ------------------------------------------------------------------------------

    def _init_parallel_state(self) -> None:
        from megatron.core import parallel_state, tensor_parallel

        from rlinf.models.megatron.pickling import keep_tensor_pickles_portable

        keep_tensor_pickles_portable()  # else every result this worker returns names megatron-core
        m = self.cfg.actor.model
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=m.tensor_model_parallel_size,
                pipeline_model_parallel_size=m.pipeline_model_parallel_size,
                context_parallel_size=m.context_parallel_size,
                expert_model_parallel_size=m.expert_model_parallel_size,
                expert_tensor_parallel_size=m.expert_tensor_parallel_size,
            )
        if self.graphs_on:
            from rlinf.models.megatron.cuda_graphs import prepare_process

            prepare_process(self.cfg.runner.seed)
        else:
            tensor_parallel.model_parallel_cuda_manual_seed(self.cfg.runner.seed)
        torch.manual_seed(self.cfg.runner.seed)
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.dp = DPInfo(
            rank=parallel_state.get_data_parallel_rank(),
            size=parallel_state.get_data_parallel_world_size(),
            reports=self.tp_rank == 0
            and parallel_state.is_pipeline_last_stage()
            and parallel_state.get_context_parallel_rank() == 0,
        )

    def _build_model(self, model_path: str) -> None:
        from megatron.core.distributed import DistributedDataParallelConfig

        from rlinf.models.megatron.bridge import provider_for, te_wgrad_fusion_without_apex

        m = self.cfg.actor.model
        self.bridge, self.provider = provider_for(
            model_path,
            self.megatron_settings,
            te_available=self.te_available,
            trust_remote_code=m.trust_remote_code,
        )
        ddp_config = DistributedDataParallelConfig(**self.megatron_settings.ddp)
        # No pre_wrap_hook argument: it would replace the bridge's HF weight load (bridge.py).
        with te_wgrad_fusion_without_apex(self.provider):
            self.model = self.provider.provide_distributed_model(ddp_config=ddp_config, wrap_with_ddp=True)
        if self.megatron_settings.grouped_experts:
            from rlinf.models.megatron.grouped_experts import view_in_place

            for chunk in self.model:
                view_in_place(chunk, ddp_config)
        self.compute_dtype = self.provider.params_dtype

    def _install_routing_replay(self) -> None:
        """algorithm.routing_replay: every MoE router of the model answers from the recorded experts
        (rlinf.models.megatron.routing_replay)."""
        self.routing_mode = self.cfg.algorithm.routing_replay.mode
        self.routing = None
        self.routing_counting = False  # only the recompute counts routing agreement
        self.routing_seconds = 0.0
        if self.routing_mode != "none":
            from rlinf.models.megatron.routing_replay import MegatronRoutingReplay

            self.routing = MegatronRoutingReplay(self.model[0])

    def _pop_routing_seconds(self) -> float:
        seconds = self.routing_seconds + (self.routing.pop_seconds() if self.routing is not None else 0.0)
        self.routing_seconds = 0.0
        return seconds

    def recompute_metrics(self) -> dict[str, float]:
        """Routing agreement counts of the last recompute, over the whole sequence: under sequence
        parallelism each TP rank's routers saw only its chunk, so the counts are summed over TP."""
        if self.routing is None:
            return {}
        counts = torch.tensor(self.routing.pop_counts(), dtype=torch.float64)
        if self.cfg.actor.model.sequence_parallel and self.tp_size > 1:
            import torch.distributed as dist

            on_device = counts.to(self.device)
            dist.all_reduce(on_device, group=self.tp_group)
            counts = on_device.cpu()
        return {
            "routing/num_agreeing": float(counts[0]),
            "routing/num_compared": float(counts[1]),
            "time/routing_recompute": self._pop_routing_seconds(),
        }

    def _build_optimizer(self) -> None:
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.utils import get_model_config

        from rlinf.models.megatron import multi_tensor
        from rlinf.models.megatron.bridge import with_torch_dtypes

        multi_tensor.install()  # without TE / apex: grad norm and clipping with no per-tensor host sync
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(**with_torch_dtypes(self.megatron_settings.optimizer)), self.model
        )
        if self.megatron_settings.compact_moments:
            from rlinf.models.megatron.compact_optimizer import use_compact_adamw

            use_compact_adamw(self.optimizer, *self.megatron_settings.compact_moments)
        config = get_model_config(self.model[0])
        config.no_sync_func = self.model[0].no_sync
        config.finalize_model_grads_func = finalize_model_grads
        config.grad_scale_func = self.optimizer.scale_loss
        self.prepared_norm: tuple[float, float] | None = None  # (grad norm, max norm) of prepared grads

    # --- forward -----------------------------------------------------------------------------------

    def dp_info(self) -> DPInfo:
        return self.dp

    @torch.no_grad()
    def policy_logprobs(self, rows: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        for chunk in self.model:
            chunk.eval()
        plan = micro_batch_rows(self, rows, self.settings.for_logprobs())
        self._pop_routing_seconds()
        self.routing_counting = True

        def forward(micros: list[RolloutBatch]):
            return (self._forward(self.model[0], inputs)[0] for _, inputs in self._stage(micros))

        try:
            old = logprobs_in_row_order(rows, plan, forward)
        finally:
            self.routing_counting = False
            if self.routing is not None:
                self.routing.clear()
        return old, None

    # --- training: hooks of run_policy_update ------------------------------------------------------

    def update_policy(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        for chunk in self.model:
            chunk.train()
        capture_seconds = self.graphs.ensure_captured() if self.graphs is not None else 0.0
        self._pop_routing_seconds()
        try:
            metrics = run_policy_update(self, batch, self.settings, step, self.skips)
        finally:
            if self.routing is not None:
                self.routing.clear()
        if self.routing is not None:
            metrics["time/routing_train"] = self._pop_routing_seconds()
        if self.graphs is not None:
            metrics["time/cuda_graph_capture"] = capture_seconds
        return metrics

    def forward_micro(self, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._logprobs(self.model[0], micro)

    def forward_backward(self, micros, loss_fn: LossFn) -> list[dict[str, torch.Tensor]]:
        """megatron's schedule (PP = 1: forward_backward_no_pipelining), then finalize_model_grads."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        metrics: list[dict[str, torch.Tensor]] = []
        num = len(micros)

        def forward_step(data_iterator, model):
            micro, inputs = next(data_iterator)
            logprobs, entropy = self._forward(model, inputs)

            def loss_func(_output):
                out = loss_fn(micro, logprobs, entropy)
                metrics.append(out.metrics)
                # The schedule divides a (loss, dict) result by the number of micro-batches; our
                # loss is already this micro-batch's share of the minibatch total.
                return out.backward_loss * num, {}

            return logprobs, loss_func

        staged = self._stage(micros, loss_fields=True, shape=self.train_shape)
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(staged),
            model=self.model,
            num_microbatches=num,
            seq_length=max(inputs.tokens.shape[1] for _, inputs in staged),
            micro_batch_size=max(inputs.tokens.shape[0] for _, inputs in staged),
            forward_only=False,
        )
        return metrics

    def all_reduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        if self.dp.size == 1:
            return tensor
        import torch.distributed as dist

        reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        on_device = tensor.to(self.device, copy=True)
        dist.all_reduce(on_device, op=reduce_op, group=self.dp_group)
        return on_device.cpu()

    def zero_grad(self) -> None:
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        self.prepared_norm = None

    def clip_grad_norm(self, max_norm: float) -> float:
        """The global pre-clip grad norm, read on the host once: the grads are prepared (copied to
        the main grads, fp16 unscaled: the loss scaler moves here, once per step) and
        `optimizer_step` clips by this norm and steps with these grads."""
        found_inf = self.optimizer.prepare_grads()
        norm = float("inf") if found_inf else self.optimizer.get_grad_norm()
        self.prepared_norm = (float("nan") if norm is None else float(norm), max_norm)
        return self.prepared_norm[0]

    def optimizer_step(self) -> None:
        """Clip (only when the coefficient is below 1) and step with the grads `clip_grad_norm`
        prepared; called on its own, it prepares them first (actor.optim.clip_grad)."""
        from rlinf.models.megatron.clip import clip_main_grads

        lr = self.cfg.actor.optim.lr * self.lr_at(self.optimizer_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.prepared_norm is None:
            self.clip_grad_norm(self.cfg.actor.optim.clip_grad)
        assert self.prepared_norm is not None
        norm, max_norm = self.prepared_norm
        self.prepared_norm = None
        if math.isfinite(norm):  # as megatron's step(), which steps nothing after an fp16 overflow
            clip_main_grads(self.optimizer, max_norm, norm)
            self.optimizer.step_with_ready_grads()
        self.optimizer_steps += 1

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # --- weights -----------------------------------------------------------------------------------

    def iter_hf_weights(self, cpu: bool = True):
        """(hf_name, full tensor) for every weight; collective: every rank must drain it."""
        if self._conversion_tasks is None:
            self._conversion_tasks = self.bridge.get_conversion_tasks(self.model)
        yield from self.bridge.export_hf_weights(
            self.model, cpu=cpu, show_progress=False, conversion_tasks=self._conversion_tasks
        )

    def export_weights(self, bucket_bytes: int) -> list[WeightBucket]:
        """HF-named buckets on global rank 0 (empty elsewhere); every rank must be called."""
        import torch.distributed as dist

        keep = dist.get_rank() == 0
        buckets: list[WeightBucket] = []
        current: WeightBucket = []
        size = 0
        # Other ranks drain the collective on the GPU: each full tensor is dropped right away
        # instead of piling up a CPU copy of the whole model per rank.
        for name, tensor in self.iter_hf_weights(cpu=keep):
            if not keep:
                continue
            nbytes = tensor.numel() * tensor.element_size()
            if current and size + nbytes > bucket_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append((name, tensor))
            size += nbytes
        if current:
            buckets.append(current)
        return buckets

    def device_weights(self):
        """Collective: Megatron-Bridge gathers each full HF tensor onto every rank's GPU, so in a
        weight sync each rank packs the same bucket and its IPC handle points at a copy on its own
        GPU (the driver pairs it with the engine TP rank on that GPU)."""
        return self.iter_hf_weights(cpu=False)

    def named_weights(self) -> dict[str, torch.Tensor]:
        return {name: tensor for bucket in self.export_weights(2**62) for name, tensor in bucket}
