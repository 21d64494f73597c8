"""Embedded actor: the HF DeepSeek-V3 model trained with AdamW on CPU or one GPU."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from pathlib import Path

import torch

from rlinf.algorithms import LossNormalizer, compute_policy_loss, reduce_metrics, should_early_stop
from rlinf.config.schema import Config
from rlinf.data.batch import RolloutBatch
from rlinf.models.logprobs import response_logprobs
from rlinf.utils.checkpoint import CheckpointError, load_hf_weights_into
from rlinf.workers.actor.base import ActorWorker, WeightBucket
from rlinf.workers.common import configure_threads, cpu_weights, load_policy, worker_device

ACTOR_STATE_FILE = "actor_state.pt"
MODEL_DIR = "model"


class TrainingDivergedError(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient norm."""


def lr_multiplier(decay_style: str, warmup_steps: int):
    def multiplier(optimizer_step: int) -> float:
        if decay_style == "warmup_constant" and warmup_steps > 0:
            return min(1.0, (optimizer_step + 1) / warmup_steps)
        return 1.0

    return multiplier


class TorchActor(ActorWorker):
    def __init__(self, cfg: Config, *, rank: int = 0, world_size: int = 1) -> None:
        configure_threads(cfg.actor.num_threads)
        torch.manual_seed(cfg.runner.seed)
        self.cfg = cfg
        self.device = worker_device()
        m = cfg.actor.model
        self.model, self.tokenizer = load_policy(m.model_path, m.precision, m.trust_remote_code, self.device)
        self.reference = self._frozen_copy() if cfg.algorithm.kl_beta > 0 else None
        o = cfg.actor.optim
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=o.lr,
            betas=(o.adam_beta1, o.adam_beta2),
            eps=o.adam_eps,
            weight_decay=o.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_multiplier(cfg.actor.lr_sched.lr_decay_style, cfg.actor.lr_sched.lr_warmup_steps),
        )
        self.consecutive_skips = 0
        self.total_skips = 0

    def _frozen_copy(self) -> torch.nn.Module:
        reference = copy.deepcopy(self.model).eval()
        reference.requires_grad_(False)
        return reference

    @property
    def temperature(self) -> float:
        t = self.cfg.algorithm.sampling_params.temperature
        return t if t > 0 else 1.0

    def _logprobs(self, model: torch.nn.Module, batch: RolloutBatch, with_entropy: bool = False):
        b = batch.trimmed()
        return response_logprobs(
            model,
            b.prompt_ids.to(self.device),
            b.prompt_mask.to(self.device),
            b.response_ids.to(self.device),
            b.response_mask.to(self.device),
            temperature=self.temperature,
            with_entropy=with_entropy,
        )

    @torch.no_grad()
    def _recompute(self, model: torch.nn.Module, batch: RolloutBatch) -> torch.Tensor:
        model.eval()
        width = batch.response_ids.shape[1]
        chunks = []
        for micro in batch.split(self.cfg.actor.micro_batch_size):
            logprobs, _ = self._logprobs(model, micro)
            chunks.append(torch.nn.functional.pad(logprobs.float().cpu(), (0, width - logprobs.shape[1])))
        return torch.cat(chunks)

    def compute_logprobs(self, batch: RolloutBatch) -> RolloutBatch:
        old = self._recompute(self.model, batch)
        ref = self._recompute(self.reference, batch) if self.reference is not None else None
        return replace(batch, old_logprobs=old, ref_logprobs=ref)

    def train(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        a, actor = self.cfg.algorithm, self.cfg.actor
        self.model.train()
        order = torch.randperm(
            len(batch), generator=torch.Generator().manual_seed(self.cfg.runner.seed + step)
        )
        shuffled = batch.select(order)
        per_minibatch, early_stopped, skipped = [], 0, 0
        for minibatch in shuffled.split(actor.global_batch_size):
            normalizer = LossNormalizer.from_masks([minibatch.response_mask])
            self.optimizer.zero_grad(set_to_none=True)
            micro_metrics = []
            for micro in minibatch.split(actor.micro_batch_size):
                micro = micro.trimmed()
                logprobs, entropy = self._logprobs(self.model, micro, with_entropy=True)
                out = compute_policy_loss(
                    a,
                    logprobs=logprobs,
                    old_logprobs=micro.old_logprobs.to(self.device),
                    advantages=micro.advantages.to(self.device),
                    response_mask=micro.response_mask.to(self.device),
                    normalizer=normalizer,
                    rollout_logprobs=micro.rollout_logprobs.to(self.device),
                    ref_logprobs=None if micro.ref_logprobs is None else micro.ref_logprobs.to(self.device),
                    # Without a bonus the entropy is only a diagnostic: keep it out of the graph.
                    entropy=entropy if a.entropy_bonus > 0 else entropy.detach(),
                )
                out.loss.backward()
                micro_metrics.append(out.metrics)
            metrics = reduce_metrics(micro_metrics)
            if should_early_stop(metrics["actor/ratio_mean"], a.early_stop_imp_ratio):
                self.optimizer.zero_grad(set_to_none=True)
                early_stopped += 1
                continue
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), actor.optim.clip_grad))
            metrics["actor/grad_norm"] = grad_norm
            if not (math.isfinite(grad_norm) and math.isfinite(metrics["actor/loss"])):
                self._skip_step()
                skipped += 1
                continue
            self.optimizer.step()
            self.scheduler.step()
            self.consecutive_skips = 0
            per_minibatch.append(metrics)
        summary = _mean_of(per_minibatch)
        summary.update(
            {
                "actor/early_stopped_minibatches": float(early_stopped),
                "actor/skipped_steps": float(skipped),
                "actor/lr": self.scheduler.get_last_lr()[0],
            }
        )
        return summary

    def _skip_step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.consecutive_skips += 1
        self.total_skips += 1
        limit = self.cfg.runner.max_consecutive_skips
        if self.consecutive_skips > limit:
            raise TrainingDivergedError(
                f"{self.consecutive_skips} consecutive optimizer steps had a non-finite loss or grad norm "
                f"(runner.max_consecutive_skips={limit}); stopping before the weights or a checkpoint are corrupted"
            )

    def export_weights(self, bucket_bytes: int) -> list[WeightBucket]:
        from rlinf.models.weights import iter_weight_buckets

        return [
            [(name, tensor.detach().cpu().clone()) for name, tensor in bucket]
            for bucket in iter_weight_buckets(self.model, bucket_bytes)
        ]

    def offload(self) -> None:
        if self.device.type == "cuda":
            self._move_to(torch.device("cpu"))
            torch.cuda.empty_cache()

    def onload(self) -> None:
        if self.device.type == "cuda":
            self._move_to(self.device)

    def _move_to(self, device: torch.device) -> None:
        self.model.to(device)
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = value.to(device)

    def named_weights(self) -> dict[str, torch.Tensor]:
        return cpu_weights(self.model)

    def save(self, directory: str) -> None:
        path = Path(directory)
        self.model.save_pretrained(path / MODEL_DIR, safe_serialization=True)
        self.tokenizer.save_pretrained(path / MODEL_DIR)
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "consecutive_skips": self.consecutive_skips,
            "total_skips": self.total_skips,
            "reference": None if self.reference is None else self.reference.state_dict(),
        }
        torch.save(state, path / ACTOR_STATE_FILE)

    def load(self, directory: str) -> None:
        path = Path(directory)
        load_hf_weights_into(self.model, path / MODEL_DIR)
        state_file = path / ACTOR_STATE_FILE
        try:
            state = torch.load(state_file, map_location="cpu", weights_only=False)
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        except FileNotFoundError:
            raise CheckpointError(f"{state_file}: missing (optimizer / LR schedule state)") from None
        except Exception as err:
            raise CheckpointError(f"{state_file}: corrupt or incompatible actor state: {err}") from None
        torch.set_rng_state(state["torch_rng"])
        self.consecutive_skips = state["consecutive_skips"]
        self.total_skips = state["total_skips"]
        if self.reference is not None and state["reference"] is not None:
            self.reference.load_state_dict(state["reference"])


def _mean_of(dicts: list[dict[str, float]]) -> dict[str, float]:
    if not dicts:
        return {}
    keys = dicts[0].keys()
    return {
        k: (max(d[k] for d in dicts) if k.endswith("_max") else sum(d[k] for d in dicts) / len(dicts))
        for k in keys
    }
