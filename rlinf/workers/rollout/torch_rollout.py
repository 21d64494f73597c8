"""Embedded rollout: the HF DeepSeek-V3 model sampling with a KV cache on CPU or one GPU."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlinf.config.schema import Config
from rlinf.data.batch import RolloutBatch
from rlinf.data.datasets import PromptItem
from rlinf.workers.common import (
    configure_threads,
    cpu_weights,
    eos_token_ids,
    load_policy,
    pad_token_id,
    worker_device,
)
from rlinf.workers.rollout.base import (
    RolloutWorker,
    WeightBucket,
    check_memory_tags,
    group_quota,
    kept_groups,
)
from rlinf.workers.rollout.partial import (
    GroupInFlight,
    PartialRollout,
    Piece,
    continuations,
    finish_step,
    step_quota,
)
from rlinf.workers.rollout.sampling import SamplingParams, sample


class TorchRollout(RolloutWorker):
    def __init__(self, cfg: Config, *, rank: int = 0, world_size: int = 1) -> None:
        configure_threads(cfg.actor.num_threads)
        self.cfg = cfg
        self.device = worker_device()
        self.model, self.tokenizer = load_policy(
            cfg.rollout.model.model_path,
            cfg.rollout.model.precision,
            cfg.actor.model.trust_remote_code,
            self.device,
        )
        self.model.eval()
        self.eos_ids = eos_token_ids(self.model.generation_config, self.tokenizer)
        self.pad_id = pad_token_id(self.tokenizer, self.eos_ids)
        self.recorder = None
        if cfg.algorithm.routing_replay.mode != "none":
            from rlinf.models.routing import ExpertRecorder, routing_shape

            routing_shape(self.model.config)  # a dense model or > 256 experts cannot be recorded
            self.recorder = ExpertRecorder(self.model)

    def generate(
        self,
        prompts: Sequence[PromptItem],
        n: int,
        params: SamplingParams,
        seed: int,
        keep_groups: int | None = None,
    ) -> RolloutBatch:
        repeated = [item for item in prompts for _ in range(n)]
        quota = group_quota(len(prompts), n, keep_groups)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        out = sample(
            self.model,
            [list(item.prompt_ids) for item in repeated],
            params,
            eos_token_ids=self.eos_ids,
            pad_token_id=self.pad_id,
            generator=generator,
            max_batch_size=self.cfg.rollout.max_batch_size,
            recorder=self.recorder,
            quota=quota,
        )
        texts = [
            self.response_text(ids[mask].tolist())
            for ids, mask in zip(out.response_ids, out.response_mask, strict=True)
        ]
        batch = RolloutBatch(
            prompt_ids=out.prompt_ids.cpu(),
            prompt_mask=out.prompt_mask.cpu(),
            response_ids=out.response_ids.cpu(),
            response_mask=out.response_mask.cpu(),
            group_index=torch.arange(len(prompts)).repeat_interleave(n),
            rollout_logprobs=out.logprobs.float().cpu(),
            finish_reasons=list(out.finish_reasons),
            response_text=texts,
            solutions=[item.solutions for item in repeated],
            prompt_experts=None if out.prompt_experts is None else out.prompt_experts.cpu(),
            response_experts=None if out.response_experts is None else out.response_experts.cpu(),
            extras={} if self.recorder is None else {"time/routing_record": self.recorder.pop_seconds()},
        )
        return kept_groups(batch, quota)

    def generate_partial(
        self, groups: Sequence[GroupInFlight], params: SamplingParams, seed: int, keep_groups: int
    ) -> PartialRollout:
        requests = continuations(groups, params.max_new_tokens)
        quota = step_quota(groups, requests, keep_groups)
        pieces = []
        if requests:  # none when every group is complete already
            generator = torch.Generator(device=self.device).manual_seed(seed)
            out = sample(
                self.model,
                [r.input_ids for r in requests],
                params,
                eos_token_ids=self.eos_ids,
                pad_token_id=self.pad_id,
                generator=generator,
                max_batch_size=self.cfg.rollout.max_batch_size,
                quota=quota,
                generated=[r.generated for r in requests],
            )
            pieces = [
                Piece(ids[mask].tolist(), lp[mask].float().tolist(), reason)
                for ids, mask, lp, reason in zip(
                    out.response_ids.cpu(),
                    out.response_mask.cpu(),
                    out.logprobs.cpu(),
                    out.finish_reasons,
                    strict=True,
                )
            ]
        return finish_step(groups, requests, pieces, quota, self.pad_id, self.response_text)

    def update_weights(self, buckets: Sequence[WeightBucket]) -> None:
        from rlinf.models.weights import load_weight_bucket

        for bucket in buckets:
            load_weight_bucket(self.model, bucket)

    def named_weights(self) -> dict[str, torch.Tensor]:
        """The engine's current weights on CPU (tests check them against the actor's)."""
        return cpu_weights(self.model)

    def sleep(self, tags: Sequence[str] | None = None) -> None:
        # The KV cache lives only inside generate; the weights go to host memory (and keep their
        # values, though the runner syncs them again anyway).
        if "weights" in check_memory_tags(tags) and self.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def wake(self, tags: Sequence[str] | None = None) -> None:
        if "weights" in check_memory_tags(tags) and self.device.type == "cuda":
            self.model.to(self.device)
