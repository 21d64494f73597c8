"""The GRPO loop: rollout -> reward -> advantages -> logprob recompute -> train -> weight sync."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from rlinf.algorithms import compute_advantages, logprob_mismatch_metrics
from rlinf.config.schema import Config
from rlinf.data.batch import RolloutBatch
from rlinf.data.prompt_loader import prompts_per_step, training_loader
from rlinf.runners.checkpointing import RunCheckpointer, planned_steps
from rlinf.runners.colocation import ColocatedMemory
from rlinf.runners.dynamic_sampling import Round, fill_batch
from rlinf.runners.hf_export import export_during_run
from rlinf.runners.pipeline import RolloutPipeline, tagged
from rlinf.runners.step_metrics import merged_scores, pass_at_k, rollout_metrics
from rlinf.scheduler.roles import Roles
from rlinf.utils.metrics import MetricLogger, PhaseTimer, progress_line
from rlinf.utils.signals import StopRequest
from rlinf.weight_sync import staged_sync, strategy_for, sync_weights
from rlinf.workers.rollout.partial import GroupInFlight
from rlinf.workers.rollout.sampling import SamplingParams

logger = logging.getLogger(__name__)


class GRPORunner:
    def __init__(self, cfg: Config, roles: Roles, train_set, val_set, metrics: MetricLogger) -> None:
        self.cfg = cfg
        self.roles = roles
        self.val_set = val_set
        self.metrics = metrics
        self.loader = training_loader(train_set, cfg)
        self.carried: list[GroupInFlight] = []  # data.partial_rollout: groups the last step left unfinished
        # runner.max_staleness >= 1: batches are drawn, generated and scored ahead, while the actor trains
        self.pipeline = (
            RolloutPipeline(
                self.loader,
                self._produce,
                max_staleness=cfg.runner.max_staleness,
                stale_samples=cfg.runner.stale_samples,
                last_step=self.total_steps,
            )
            if cfg.runner.max_staleness
            else None
        )
        position = self.pipeline.resume_position if self.pipeline else None
        self.checkpointer = RunCheckpointer(cfg, roles, self.loader, metrics, data_position=position)
        self.timer = PhaseTimer()
        self.memory = ColocatedMemory(
            roles,
            offload_actor=cfg.actor.offload_between_phases,
            timer=self.timer,
            overlapped=self.pipeline is not None,
        )
        self.stop = StopRequest()
        self.step = 0
        self.sampling = SamplingParams.from_config(cfg.algorithm.sampling_params)
        self.greedy = replace(self.sampling, greedy=True)

    @property
    def total_steps(self) -> int:
        return planned_steps(self.cfg, self.loader)

    def run(self) -> Path | None:
        """Train to the end (or a stop signal); returns the last checkpoint's path."""
        r = self.cfg.runner
        self.step, self.carried = self.checkpointer.maybe_resume(self.memory.sync_after_load)
        self.memory.start()
        if self.step == 0 and r.val_check_interval > 0:
            self.metrics.log(self.validate(), step=0)
        started = time.perf_counter()
        with self.stop.installed(), self.producing():
            while self.step < self.total_steps and not self.stop.requested:
                self.step += 1
                metrics = self.train_step()
                if r.val_check_interval > 0 and (
                    self.step % r.val_check_interval == 0 or self.step == self.total_steps
                ):
                    metrics.update(self.validate())
                self.metrics.log(metrics, step=self.step)
                print(
                    progress_line(self.step, self.total_steps, metrics, time.perf_counter() - started),
                    flush=True,
                )
                if r.save_interval > 0 and self.step % r.save_interval == 0:
                    self.save()
                if r.export_hf_interval > 0 and self.step % r.export_hf_interval == 0:
                    self.export_hf()
        last = self.save() if r.save_at_end else None
        if r.export_hf_interval > 0 and self.step % r.export_hf_interval != 0:
            self.export_hf()
        if self.stop.requested:
            where = f"checkpoint saved to {last}" if last else "no checkpoint (runner.save_at_end: false)"
            print(f"stopped by {self.stop.signal_name} after step {self.step}; {where}", flush=True)
        return last

    @contextmanager
    def producing(self):
        """runner.max_staleness >= 1: the producer runs ahead while the loop trains; it stops (its
        request in flight dropped) when the loop ends, before the final save."""
        if self.pipeline is None:
            yield
            return
        strategy_for(self.roles)  # asked while the rollout is idle: a generate would hold the question up
        self.pipeline.start(self.step)
        try:
            yield
        finally:
            self.pipeline.close()

    def save(self) -> Path:
        with self.memory.around_checkpoint():
            return self.checkpointer.save(self.step, self.carried)

    def export_hf(self) -> Path:
        with self.memory.around_checkpoint():
            folder = export_during_run(self.cfg, self.roles, self.step)
        print(f"exported the actor's weights as a Hugging Face folder: {folder}", flush=True)
        return folder

    def train_step(self) -> dict[str, float]:
        a, roles = self.cfg.algorithm, self.roles
        step_start = time.perf_counter()
        batch, sampling_metrics = self.scored_batch()
        advantages = compute_advantages(
            a.adv_type, batch.rewards, batch.group_index, normalize=a.normalize_advantages
        )
        batch = replace(batch, advantages=advantages.advantages)
        self.memory.before_actor()  # colocated: the rollout frees the GPUs, the actor comes back
        if a.recompute_logprobs:
            with self.timer.phase("logprobs"):
                batch = roles.actor.compute_logprobs(batch)
        else:  # pi_old is the behaviour policy as the rollout reported it
            batch = replace(batch, old_logprobs=batch.rollout_logprobs)
        with self.timer.phase("train"):
            actor_metrics = roles.actor.train(batch, self.step)
        self.sync_rollout()
        metrics = {
            **rollout_metrics(batch),
            **sampling_metrics,
            **advantages.metrics,
            **actor_metrics,
            **self.memory.pop_metrics(),
        }
        if a.recompute_logprobs:  # without the recompute there is nothing to compare
            metrics.update(
                logprob_mismatch_metrics(batch.rollout_logprobs, batch.old_logprobs, batch.response_mask)
            )
        metrics.update(self.timer.pop())
        metrics["time/step"] = time.perf_counter() - step_start
        metrics["throughput/tokens_per_s"] = metrics["rollout/num_response_tokens"] / metrics["time/step"]
        return metrics

    def scored_batch(self) -> tuple[RolloutBatch, dict[str, float]]:
        """The step's scored batch, its rows tagged with the policy version that generated them, and
        the generation's metrics: generated now (one round, or more with
        algorithm.dynamic_sampling: rlinf.runners.dynamic_sampling), or taken from the pipeline
        (runner.max_staleness)."""
        if self.pipeline is not None:
            return self.pipeline.next_batch(self.step)
        batch, metrics = fill_batch(
            self.generation_round, self.cfg.data.rollout_batch_size, self.cfg.algorithm.dynamic_sampling
        )
        return tagged(batch, self.step - 1), metrics

    def sync_rollout(self) -> None:
        """The updated weights into the rollout: now, or handed to the pipeline."""
        bucket_mb = self.cfg.rollout.weight_sync_bucket_mb
        if self.pipeline is None:
            self.memory.sync_and_resume(lambda: sync_weights(self.roles, bucket_mb))
            return
        with self.timer.phase("weight_sync"):
            self.pipeline.publish(self.step, *staged_sync(self.roles, bucket_mb))

    def _produce(self, step: int, prompts: list) -> tuple[RolloutBatch, dict[str, float]]:
        """The pipeline's producer: step `step`'s prompts generated and scored, timed on its own clock."""
        timer = PhaseTimer()
        with timer.phase("rollout"):
            batch = self._generate(prompts, self._seed("rollout", step=step))
        with timer.phase("reward"):
            batch = self.roles.reward.score(batch)
        return batch, timer.pop()

    def generation_round(self, index: int) -> Round:
        """Round `index` of the step's generation: prompts drawn, generated and scored."""
        with self.timer.phase("rollout"):
            batch, prompts = self.rollout(self._seed("rollout", index))
        with self.timer.phase("reward"):
            batch = self.roles.reward.score(batch)
        return Round(batch, prompts)

    def rollout(self, seed: int) -> tuple[RolloutBatch, int]:
        """A round's batch (with data.partial_rollout, its carry metrics in the extras) and the
        prompts it drew. With oversample_prompts the rollout ends once rollout_batch_size groups are
        complete; the other groups are dropped, or carried: next step they are generated on again,
        with fewer fresh prompts drawn, so that the same number of groups is in flight every step."""
        d, n = self.cfg.data, self.cfg.algorithm.group_size
        if not d.partial_rollout:
            prompts = self.loader.next_batch()
            return self._generate(prompts, seed), len(prompts)
        fresh = self.loader.next_batch(prompts_per_step(d) - len(self.carried))
        groups = self.carried + [GroupInFlight.fresh(item, n) for item in fresh]
        result = self.roles.rollout.generate_partial(groups, self.sampling, seed, d.rollout_batch_size)
        self.carried = result.carried
        batch = result.batch
        return replace(batch, extras={**batch.extras, **result.metrics()}), len(fresh)

    def _generate(self, prompts: list, seed: int) -> RolloutBatch:
        """`prompts` x group_size responses; with data.oversample_prompts the rollout stops once
        rollout_batch_size groups are complete."""
        d = self.cfg.data
        keep = d.rollout_batch_size if d.oversample_prompts else None
        return self.roles.rollout.generate(
            prompts, self.cfg.algorithm.group_size, self.sampling, seed, keep_groups=keep
        )

    def validate(self) -> dict[str, float]:
        """Greedy pass@1 on the validation split; with val_n > 1 also sampled mean@k and pass@k."""
        if self.val_set is None:
            return {}
        if self.pipeline is not None:
            with self.pipeline.rollout_current():  # the actor's newest weights, no request in flight
                return self._validate()
        return self._validate()

    def _validate(self) -> dict[str, float]:
        started = time.perf_counter()
        items = list(self.val_set)
        size = self.cfg.data.val_batch_size or len(items)  # prompts per generate call
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        greedy, _ = merged_scores([self._score(c, 1, self.greedy, i) for i, c in enumerate(chunks)])
        metrics = {"val/accuracy": float(greedy.float().mean())}
        n = self.cfg.algorithm.val_n
        if n > 1:
            sampled = merged_scores([self._score(c, n, self.sampling, i) for i, c in enumerate(chunks)])
            mean_k, pass_k = pass_at_k(*sampled)
            metrics.update({f"val/mean@{n}": mean_k, f"val/pass@{n}": pass_k})
        metrics["time/validation"] = time.perf_counter() - started
        return metrics

    def _score(self, items: list, n: int, params: SamplingParams, chunk: int = 0):
        batch = self.roles.rollout.generate(items, n, params, self._seed("validation", chunk))
        return self.roles.reward.score(batch)

    def _seed(self, purpose: str, part: int = 0, *, step: int | None = None) -> int:
        # Depends only on (seed, step, purpose, part): a resumed run samples exactly what the original
        # would. Part 0 (a step's first generation round, the first validation chunk) keeps the seed
        # it had before parts existed; later parts (dynamic sampling's refill rounds, validation
        # chunks) move far past any step's seeds (step * 2 < 2**40), and rollout seeds stay even,
        # validation seeds odd, so the two never meet. `step`: another step's (the pipeline's producer).
        offset = {"rollout": 0, "validation": 1}[purpose]
        step = self.step if step is None else step
        return (self.cfg.runner.seed * 1_000_003 + step * 2 + offset + part * 2**40) % (2**63)
