"""Embedded actor: the HF DeepSeek-V3 model trained with AdamW, data parallel over N workers.

With `actor.num_workers` = N > 1 every worker holds a full replica wrapped in torch's
DistributedDataParallel (gloo on CPU, NCCL on GPU; the worker group has already joined the
process group). The GRPO update itself is the backend-agnostic loop of
rlinf.workers.actor.policy_update; this class supplies its hooks. With `precision: bf16` (or fp16)
the model computes in that dtype and AdamW updates fp32 master weights (mixed_precision.py).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from rlinf.algorithms.lr_schedule import lr_multiplier_from_config
from rlinf.config.schema import Config
from rlinf.data.batch import RolloutBatch
from rlinf.data.routing import has_routing, packed_targets, padded_targets
from rlinf.models.logprobs import response_logprobs
from rlinf.utils.checkpoint import CheckpointError, load_hf_weights_into
from rlinf.workers.actor.base import ActorWorker, WeightBucket
from rlinf.workers.actor.mixed_precision import MasterWeights
from rlinf.workers.actor.policy_update import (
    DPInfo,
    PolicyUpdateBackend,
    SkipCounter,
    TrainingDivergedError,
    UpdateSettings,
    logprobs_in_row_order,
    micro_batch_rows,
    run_policy_update,
)
from rlinf.workers.common import configure_threads, cpu_weights, load_policy, worker_device

__all__ = ["TorchActor", "TrainingDivergedError"]

ACTOR_STATE_FILE = "actor_state.pt"
MODEL_DIR = "model"


class TorchActor(ActorWorker, PolicyUpdateBackend):
    def __init__(self, cfg: Config, *, rank: int = 0, world_size: int = 1) -> None:
        configure_threads(cfg.actor.num_threads)
        torch.manual_seed(cfg.runner.seed)
        self.cfg = cfg
        self.device = worker_device()
        self.dp = DPInfo(rank=rank, size=world_size)
        m = cfg.actor.model
        self.model, self.tokenizer = load_policy(m.model_path, m.precision, m.trust_remote_code, self.device)
        self.reference = self._frozen_copy() if cfg.algorithm.kl_beta > 0 else None
        self.trained = self._data_parallel(self.model) if world_size > 1 else self.model
        self.master = MasterWeights(self.model)
        o = cfg.actor.optim
        self.optimizer = torch.optim.AdamW(
            self.master.params,
            lr=o.lr,
            betas=(o.adam_beta1, o.adam_beta2),
            eps=o.adam_eps,
            weight_decay=o.weight_decay,
        )
        self.lr_at = lr_multiplier_from_config(cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_at)
        self.settings = UpdateSettings.from_config(cfg)
        self.skips = SkipCounter()
        self.routing_mode = cfg.algorithm.routing_replay.mode
        self.replays = self._routing_replays()
        self.routing_seconds = 0.0

    def _routing_replays(self) -> dict[int, object]:
        """An ExpertReplay per model the actor runs forwards of (policy, reference), by id."""
        if self.routing_mode == "none":
            return {}
        from rlinf.models.routing import ExpertReplay, routing_shape

        routing_shape(self.model.config)  # a dense model or > 256 experts cannot be replayed
        models = [self.model] + ([self.reference] if self.reference is not None else [])
        return {id(model): ExpertReplay(model) for model in models}

    def _data_parallel(self, model: torch.nn.Module) -> torch.nn.Module:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError(
                f"actor rank {self.dp.rank} of {self.dp.size}: torch.distributed is not initialised; "
                "data-parallel actors must be started by a WorkerGroup with distributed=True"
            )
        return torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=[0] if self.device.type == "cuda" else None,
            # MoE experts that no token of a micro-batch reaches get no gradient on that rank.
            find_unused_parameters=True,
            # Buffers (rotary tables) are equal on every rank and never trained.
            broadcast_buffers=False,
        )

    def _frozen_copy(self) -> torch.nn.Module:
        reference = copy.deepcopy(self.model).eval()
        reference.requires_grad_(False)
        return reference

    @property
    def consecutive_skips(self) -> int:
        return self.skips.consecutive

    @property
    def total_skips(self) -> int:
        return self.skips.total

    def dp_info(self) -> DPInfo:
        return self.dp

    # --- logprob recompute: this rank's contiguous rows --------------------------------------------

    def _logprobs(
        self, model: torch.nn.Module, batch: RolloutBatch, with_entropy: bool = False, count: bool = False
    ):
        b = batch.trimmed()
        with self._routing(model, b, count):
            return response_logprobs(
                model,
                b.prompt_ids.to(self.device),
                b.prompt_mask.to(self.device),
                b.response_ids.to(self.device),
                b.response_mask.to(self.device),
                temperature=self.temperature,
                with_entropy=with_entropy,
                packed=self.cfg.actor.pack_sequences,
            )

    def _routing(self, model: torch.nn.Module, micro: RolloutBatch, count: bool):
        """algorithm.routing_replay: the recorded experts laid out in this forward's token order
        (padded or packed), replayed (mode replay) and, with `count`, compared with the router's own."""
        replay = self.replays.get(id(getattr(model, "module", model)))  # DDP wraps the policy
        if replay is None:
            return contextlib.nullcontext()
        if not has_routing(micro):
            raise ValueError(
                f"algorithm.routing_replay.mode={self.routing_mode}: the batch carries no recorded experts"
            )
        started = time.perf_counter()
        targets, recorded = (packed_targets if self.cfg.actor.pack_sequences else padded_targets)(micro)
        self.routing_seconds += time.perf_counter() - started
        return replay.replaying(
            targets.to(self.device),
            recorded.to(self.device),
            force=self.routing_mode == "replay",
            count=count,
        )

    def _pop_routing_seconds(self) -> float:
        """Seconds routing replay added since the last call: layouts plus the gates' hooks."""
        seconds = self.routing_seconds + sum(replay.pop_seconds() for replay in self.replays.values())  # type: ignore[attr-defined]
        self.routing_seconds = 0.0
        return seconds

    @torch.no_grad()
    def _recompute(self, model: torch.nn.Module, batch: RolloutBatch, plan: list[list[int]]) -> torch.Tensor:
        model.eval()
        count = model is self.model  # routing agreement of the policy, not of the reference
        return logprobs_in_row_order(
            batch, plan, lambda micros: (self._logprobs(model, m, count=count)[0] for m in micros)
        )

    def policy_logprobs(self, rows: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        plan = micro_batch_rows(self, rows, self.settings.for_logprobs())
        self._pop_routing_seconds()
        old = self._recompute(self.model, rows, plan)
        return old, self._recompute(self.reference, rows, plan) if self.reference is not None else None

    def recompute_metrics(self) -> dict[str, float]:
        if not self.replays:
            return {}
        agreeing, compared = self.replays[id(self.model)].pop_counts()  # type: ignore[attr-defined]
        return {
            "routing/num_agreeing": float(agreeing),
            "routing/num_compared": float(compared),
            "time/routing_recompute": self._pop_routing_seconds(),
        }

    # --- training: hooks of run_policy_update ------------------------------------------------------

    def update_policy(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        self.model.train()
        self._pop_routing_seconds()
        metrics = run_policy_update(self, batch, self.settings, step, self.skips)
        if self.replays:
            metrics["time/routing_train"] = self._pop_routing_seconds()
        return metrics

    def forward_micro(self, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._logprobs(self.trained, micro, with_entropy=True)

    def all_reduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        if self.dp.size == 1:
            return tensor
        import torch.distributed as dist

        reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        # NCCL reduces device tensors only; gloo takes CPU ones.
        on_device = tensor.to(self.device, copy=True)
        dist.all_reduce(on_device, op=reduce_op)
        return on_device.cpu()

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)
        self.master.zero_grad()

    def clip_grad_norm(self, max_norm: float) -> float:
        # DDP has already averaged the gradients, so this norm is the same on every rank.
        self.master.grads_to_master()
        return float(torch.nn.utils.clip_grad_norm_(self.master.params, max_norm))

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.scheduler.step()
        self.master.master_to_model()

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # --- weights, memory, checkpoints --------------------------------------------------------------

    def export_weights(self, bucket_bytes: int) -> list[WeightBucket]:
        from rlinf.models.weights import iter_weight_buckets

        return [
            [(name, tensor.detach().cpu().clone()) for name, tensor in bucket]
            for bucket in iter_weight_buckets(self.model, bucket_bytes)
        ]

    def device_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        from rlinf.models.weights import checkpoint_tensors

        return checkpoint_tensors(self.model)

    def offload(self) -> dict[str, float]:
        if self.device.type != "cuda":
            return {}
        before = torch.cuda.memory_allocated()
        self._move_to(torch.device("cpu"))
        torch.cuda.empty_cache()
        return {"actor/offload_freed_gib": (before - torch.cuda.memory_allocated()) / 2**30}

    def onload(self) -> None:
        if self.device.type == "cuda":
            self._move_to(self.device)

    def _move_to(self, device: torch.device) -> None:
        # In place (`.data`): DDP's buckets and the optimizer keep referring to the same parameters.
        for param in self.model.parameters():
            param.data = param.data.to(device)
        self.master.move_to(device)
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = value.to(device)

    def named_weights(self) -> dict[str, torch.Tensor]:
        return cpu_weights(self.model)

    def save(self, directory: str) -> int:
        """Rank 0 writes: DDP replicas hold identical weights and optimizer state."""
        if self.dp.rank != 0:
            return self.scheduler.last_epoch
        path = Path(directory)
        self.model.save_pretrained(path / MODEL_DIR, safe_serialization=True)
        self.tokenizer.save_pretrained(path / MODEL_DIR)
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "master_weights": self.master.state(),
            "torch_rng": torch.get_rng_state(),
            "consecutive_skips": self.skips.consecutive,
            "total_skips": self.skips.total,
            "reference": None if self.reference is None else self.reference.state_dict(),
        }
        torch.save(state, path / ACTOR_STATE_FILE)
        return self.scheduler.last_epoch  # LambdaLR counts its steps as epochs: one per optimizer step

    def export_hf(self, directory: str) -> None:
        """Rank 0 writes: the same folder a checkpoint keeps under actor/model."""
        if self.dp.rank != 0:
            return
        self.model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)

    def load(self, directory: str) -> None:
        path = Path(directory)
        load_hf_weights_into(self.model, path / MODEL_DIR)
        state_file = path / ACTOR_STATE_FILE
        try:
            state = torch.load(state_file, map_location="cpu", weights_only=False)
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self._follow_this_runs_schedule()
            self.master.load_state(state.get("master_weights"))
        except FileNotFoundError:
            raise CheckpointError(f"{state_file}: missing (optimizer / LR schedule state)") from None
        except Exception as err:
            raise CheckpointError(f"{state_file}: corrupt or incompatible actor state: {err}") from None
        torch.set_rng_state(state["torch_rng"])
        self.skips = SkipCounter(state["consecutive_skips"], state["total_skips"])
        if self.reference is not None and state["reference"] is not None:
            self.reference.load_state_dict(state["reference"])

    def _follow_this_runs_schedule(self) -> None:
        """After a load: this run's LR schedule (its config; rlinf.runners.lr_resume decides what the
        config holds) at the restored optimizer-step count. The loaded states carry the saving run's
        peak LR (the scheduler's base_lrs) and its next LR (the param groups'): both are set anew."""
        peak = self.cfg.actor.optim.lr
        lr = peak * self.lr_at(self.scheduler.last_epoch)
        self.scheduler.base_lrs = [peak] * len(self.optimizer.param_groups)
        for group in self.optimizer.param_groups:
            group["initial_lr"], group["lr"] = peak, lr
