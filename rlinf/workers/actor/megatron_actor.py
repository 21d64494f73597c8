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
import os
import time
from contextlib import contextmanager

import torch

from rlinf.algorithms.lr_schedule import lr_multiplier_from_config
from rlinf.config.schema import Config
from rlinf.data.batch import RolloutBatch
from rlinf.workers.actor.base import ActorWorker, WeightBucket
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


@contextmanager
def loss_scale_frozen(optimizer):
    """The fp16 loss scalers of a megatron (chained) optimizer keep their scale and counters."""
    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    scalers = list({id(s): s for p in parts if (s := getattr(p, "grad_scaler", None)) is not None}.values())
    for scaler in scalers:
        scaler.update = lambda found_inf: None  # shadows the class's method on this instance
    try:
        yield
    finally:
        for scaler in scalers:
            del scaler.update


class MegatronActor(MegatronActorState, ActorWorker, PolicyUpdateBackend):
    INITS_PROCESS_GROUP = True

    def __init__(self, cfg: Config, *, rank: int = 0, world_size: int = 1, device: str = "cuda") -> None:
        """`device="cpu"` joins a gloo group instead of NCCL: only for the multi-process CPU tests
        (tests/megatron_cpu/many_ranks.py), which also put megatron-core's CUDA calls on the CPU."""
        import torch.distributed as dist

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
        self.cfg = cfg
        _set_default_dist_env(rank, world_size)
        if device == "cuda":
            # Ray shows each rank one GPU; under torchrun every GPU is visible and LOCAL_RANK picks one.
            index = int(os.environ.get("LOCAL_RANK", "0")) if torch.cuda.device_count() > 1 else 0
            torch.cuda.set_device(index)
            self.device = torch.device("cuda", index)
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

    def _replay_routing(self, micro: RolloutBatch, width: int, packed: bool) -> None:
        """Lay the micro-batch's recorded experts out in the routers' token order of this forward
        (right-padded or packed THD, `width` columns; this rank's chunk under sequence parallelism)."""
        if self.routing is None:
            return
        from rlinf.data.routing import has_routing, packed_thd_targets, right_padded_targets

        if not has_routing(micro):
            raise ValueError(
                f"algorithm.routing_replay.mode={self.routing_mode}: the batch carries no recorded experts"
            )
        started = time.perf_counter()
        split = self.cfg.actor.model.sequence_parallel and self.tp_size > 1
        layout = packed_thd_targets if packed else right_padded_targets
        targets, recorded = layout(
            micro, width, tp_rank=self.tp_rank if split else 0, tp_size=self.tp_size if split else 1
        )
        self.routing.set_targets(
            targets.to(self.device),
            recorded.to(self.device),
            force=self.routing_mode == "replay",
            count=self.routing_counting,
        )
        self.routing_seconds += time.perf_counter() - started

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

    # --- forward -----------------------------------------------------------------------------------

    def dp_info(self) -> DPInfo:
        return self.dp

    def _right_padded(self, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded tokens [b, T] (prompt then all R response columns) and each row's prompt length."""
        prompt_lens = micro.prompt_mask.sum(1)
        width = micro.prompt_ids.shape[1]
        r = micro.response_ids.shape[1]
        total = int(prompt_lens.max()) + r
        multiple = self.tp_size if self.cfg.actor.model.sequence_parallel else 1
        total = -(-total // multiple) * multiple
        tokens = torch.zeros(len(micro), total, dtype=torch.long)
        for i, p in enumerate(prompt_lens.tolist()):
            tokens[i, :p] = micro.prompt_ids[i, width - p :]
            tokens[i, p : p + r] = micro.response_ids[i]
        return tokens, prompt_lens

    def _packed_thd(self, micro: RolloutBatch):
        """(tokens [1, T], positions [1, T], PackedSeqParams, index [N]): every row's real tokens
        back to back (THD, positions restarting per sequence), padded at the end to a multiple of
        TP under sequence parallelism by one more sequence; `index` is the packed position that
        predicts each real response token, in row-major order."""
        from megatron.core.packed_seq_params import PackedSeqParams

        from rlinf.models.logprobs import pack_rows, packed_predictors

        mask = torch.cat([micro.prompt_mask.bool(), micro.response_mask.bool()], dim=1)
        kwargs, where = pack_rows(torch.cat([micro.prompt_ids, micro.response_ids], dim=1), mask)
        index = packed_predictors(where, micro.prompt_ids.shape[1], micro.response_mask)
        lengths = mask.sum(1).tolist()
        tokens, positions = kwargs["input_ids"], kwargs["position_ids"]
        multiple = self.tp_size if self.cfg.actor.model.sequence_parallel else 1
        pad = -sum(lengths) % multiple
        if pad:
            tokens = torch.cat([tokens, tokens.new_zeros(1, pad)], dim=1)
            positions = torch.cat([positions, torch.arange(pad)[None]], dim=1)
            lengths.append(pad)
        bounds = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(self.device)
        params = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=bounds,
            cu_seqlens_kv=bounds,
            max_seqlen_q=max(lengths),
            max_seqlen_kv=max(lengths),
        )
        return tokens.to(self.device), positions.to(self.device), params, index.to(self.device)

    def _logits(self, model, tokens: torch.Tensor, positions: torch.Tensor, **extra) -> torch.Tensor:
        """Vocab-parallel logits [b, T, V / TP], kept in the compute dtype (Float16Module's
        fp32_output off); logprobs.py upcasts chunk by chunk."""
        half = {"fp32_output": False} if self.cfg.actor.model.precision != "fp32" else {}
        return model(input_ids=tokens, position_ids=positions, attention_mask=None, **extra, **half)

    def _tempered(self, picked: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tempered logprobs and entropy of `targets` under the picked vocab-parallel logits."""
        from rlinf.models.megatron.logprobs import vocab_parallel_logprobs

        return vocab_parallel_logprobs(
            picked, targets, temperature=self.temperature, vocab_start=self.tp_rank * picked.shape[-1],
            group=self.tp_group,
        )  # fmt: skip

    def _packed_logprobs(self, model, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """`_logprobs` over one packed row: the forward runs the rows' real tokens only."""
        tokens, positions, params, index = self._packed_thd(micro)
        self._replay_routing(micro, tokens.shape[1], packed=True)
        logits = self._logits(model, tokens, positions, packed_seq_params=params)
        mask = micro.response_mask.to(self.device).bool()
        logprobs, entropy = self._tempered(logits[:, index], micro.response_ids.to(self.device)[mask][None])
        zeros = torch.zeros(mask.shape, dtype=logprobs.dtype, device=self.device)
        return zeros.masked_scatter(mask, logprobs[0]), zeros.masked_scatter(mask, entropy[0])

    def _logprobs(self, model, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Tempered logprobs and entropy [b, R] of the response tokens (0 where masked)."""
        if self.cfg.actor.pack_sequences:
            return self._packed_logprobs(model, micro)
        tokens, prompt_lens = self._right_padded(micro)
        self._replay_routing(micro, tokens.shape[1], packed=False)
        tokens = tokens.to(self.device)
        positions = torch.arange(tokens.shape[1], device=self.device).expand_as(tokens)
        logits = self._logits(model, tokens, positions)
        r = micro.response_ids.shape[1]
        # Column p - 1 + j (the token before response token j) predicts response token j.
        index = (prompt_lens.to(self.device) - 1)[:, None] + torch.arange(r, device=self.device)[None]
        picked = logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))
        logprobs, entropy = self._tempered(picked, micro.response_ids.to(self.device))
        mask = micro.response_mask.to(self.device).bool()
        return logprobs.masked_fill(~mask, 0.0), entropy.masked_fill(~mask, 0.0)

    @torch.no_grad()
    def policy_logprobs(self, rows: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        for chunk in self.model:
            chunk.eval()
        plan = micro_batch_rows(self, rows, self.settings)
        self._pop_routing_seconds()
        self.routing_counting = True
        try:
            old = logprobs_in_row_order(rows, plan, lambda micro: self._logprobs(self.model[0], micro)[0])
        finally:
            self.routing_counting = False
            if self.routing is not None:
                self.routing.clear()
        return old, None

    # --- training: hooks of run_policy_update ------------------------------------------------------

    def update_policy(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        for chunk in self.model:
            chunk.train()
        self._pop_routing_seconds()
        try:
            metrics = run_policy_update(self, batch, self.settings, step, self.skips)
        finally:
            if self.routing is not None:
                self.routing.clear()
        if self.routing is not None:
            metrics["time/routing_train"] = self._pop_routing_seconds()
        return metrics

    def forward_micro(self, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._logprobs(self.model[0], micro)

    def forward_backward(self, micros, loss_fn: LossFn) -> list[dict[str, torch.Tensor]]:
        """megatron's schedule (PP = 1: forward_backward_no_pipelining), then finalize_model_grads."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        metrics: list[dict[str, torch.Tensor]] = []
        num = len(micros)

        def forward_step(data_iterator, model):
            micro = next(data_iterator)
            logprobs, entropy = self._logprobs(model, micro)

            def loss_func(_output):
                out = loss_fn(micro, logprobs, entropy)
                metrics.append(out.metrics)
                # The schedule divides a (loss, dict) result by the number of micro-batches; our
                # loss is already this micro-batch's share of the minibatch total.
                return out.backward_loss * num, {}

            return logprobs, loss_func

        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micros),
            model=self.model,
            num_microbatches=num,
            seq_length=max(int(m.prompt_mask.sum(1).max()) + m.response_ids.shape[1] for m in micros),
            micro_batch_size=max(len(m) for m in micros),
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

    def clip_grad_norm(self, max_norm: float) -> float:
        """The global pre-clip grad norm; the clipping itself happens inside optimizer.step()."""
        found_inf = self.optimizer.prepare_grads()
        if found_inf:
            return float("inf")
        norm = self.optimizer.get_grad_norm()
        return float("nan") if norm is None else float(norm)

    def optimizer_step(self) -> None:
        lr = self.cfg.actor.optim.lr * self.lr_at(self.optimizer_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # step() prepares the grads again (copy to the main grads, unscale): the same values as in
        # clip_grad_norm, but fp16's loss scaler must move once per step, and it already has.
        with loss_scale_frozen(self.optimizer):
            self.optimizer.step()
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
