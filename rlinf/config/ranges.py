"""The range of every numeric recipe key, checked before anything starts (one table, one rule).

A NaN or infinite float is refused for every key. Each int and float key of the schema has a
range here; tests/unit/test_config_ranges.py fails for a numeric schema key without one, so a new
key cannot slip through unchecked. Rules between several keys stay in rlinf/config/validate.py.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass

from rlinf.config.schema import Config
from rlinf.config.typed import ConfigError


@dataclass(frozen=True)
class Range:
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False  # the bound itself is excluded
    high_open: bool = False
    also: tuple[int, ...] = ()  # sentinel values allowed outside the range, e.g. -1 = "no limit"
    why: str = ""  # appended to the message

    def holds(self, value: float) -> bool:
        if value in self.also:
            return True
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def describe(self) -> str:
        if math.isinf(self.low) and math.isinf(self.high):
            text = "a finite number"
        elif math.isinf(self.high):
            text = f"{'>' if self.low_open else '>='} {_number(self.low)}"
        elif math.isinf(self.low):
            text = f"{'<' if self.high_open else '<='} {_number(self.high)}"
        else:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            text = f"in {left}{_number(self.low)}, {_number(self.high)}{right}"
        if self.also:
            text = f"{' or '.join(map(str, self.also))} or {text}"
        return text + (f" ({self.why})" if self.why else "")


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


FINITE = Range()
NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
AT_LEAST_1 = Range(1)
FRACTION = Range(0, 1, low_open=True)  # (0, 1]
BETA = Range(0, 1, high_open=True)  # [0, 1)

RANGES: dict[str, Range] = {
    "cluster.num_nodes": AT_LEAST_1,
    "cluster.num_gpus_per_node": NON_NEGATIVE,
    "runner.seed": NON_NEGATIVE,
    "runner.max_epochs": AT_LEAST_1,
    "runner.max_steps": Range(1, also=(-1,), why="-1 = bounded by runner.max_epochs only"),
    "runner.val_check_interval": NON_NEGATIVE,
    "runner.save_interval": NON_NEGATIVE,
    "runner.export_hf_interval": NON_NEGATIVE,
    "runner.keep_checkpoints": AT_LEAST_1,
    "runner.max_consecutive_skips": NON_NEGATIVE,
    "runner.max_staleness": NON_NEGATIVE,
    "algorithm.group_size": Range(2, why="group advantages need 2+ responses per prompt"),
    "algorithm.ratio_clip_eps": Range(0, 1, low_open=True, high_open=True),
    "algorithm.clip_ratio_high": POSITIVE,
    "algorithm.clip_ratio_c": Range(1, low_open=True, why="or null = off"),
    "algorithm.kl_beta": NON_NEGATIVE,
    "algorithm.entropy_bonus": NON_NEGATIVE,
    "algorithm.early_stop_imp_ratio": Range(why="0 or below, or null, disables it"),
    "algorithm.rollout_is.clip": POSITIVE,
    "algorithm.sampling_params.temperature": Range(0, why="0 = greedy"),
    "algorithm.sampling_params.top_p": FRACTION,
    "algorithm.sampling_params.top_k": Range(1, also=(-1,), why="-1 = all tokens"),
    "algorithm.sampling_params.max_new_tokens": AT_LEAST_1,
    "algorithm.sampling_params.min_new_tokens": NON_NEGATIVE,
    "algorithm.val_n": AT_LEAST_1,
    "algorithm.dynamic_sampling.max_gen_rounds": AT_LEAST_1,
    "data.max_prompt_length": AT_LEAST_1,
    "data.rollout_batch_size": AT_LEAST_1,
    "data.oversample_prompts": NON_NEGATIVE,
    "data.val_batch_size": Range(1, why="or null = all at once"),
    "data.synthetic.digits": AT_LEAST_1,
    "data.synthetic.steps": AT_LEAST_1,
    "data.synthetic.num_train": AT_LEAST_1,
    "data.synthetic.num_val": NON_NEGATIVE,
    "actor.micro_batch_size": AT_LEAST_1,
    "actor.max_tokens_per_micro_batch": Range(1, why="or null = actor.micro_batch_size rows"),
    "actor.logprob_micro_batch_size": Range(1, why="or null = actor.micro_batch_size"),
    "actor.logprob_max_tokens_per_micro_batch": Range(1, why="or null = actor.max_tokens_per_micro_batch"),
    "actor.global_batch_size": AT_LEAST_1,
    "actor.seq_length": AT_LEAST_1,
    "actor.model.tensor_model_parallel_size": AT_LEAST_1,
    "actor.model.pipeline_model_parallel_size": AT_LEAST_1,
    "actor.model.expert_model_parallel_size": AT_LEAST_1,
    "actor.model.expert_tensor_parallel_size": AT_LEAST_1,
    "actor.model.context_parallel_size": AT_LEAST_1,
    "actor.model.moe_router_bias_update_rate": NON_NEGATIVE,
    "actor.optim.lr": NON_NEGATIVE,
    "actor.optim.weight_decay": NON_NEGATIVE,
    "actor.optim.adam_beta1": BETA,
    "actor.optim.adam_beta2": BETA,
    "actor.optim.adam_eps": POSITIVE,
    "actor.optim.clip_grad": POSITIVE,
    "actor.lr_sched.lr_warmup_steps": NON_NEGATIVE,
    "actor.lr_sched.lr_decay_steps": Range(1, why="or null = the run's optimizer steps"),
    "actor.lr_sched.min_lr_ratio": Range(0, 1),
    "actor.num_threads": Range(1, why="or null = torch's default"),
    "actor.num_workers": AT_LEAST_1,
    "rollout.tensor_parallel_size": AT_LEAST_1,
    "rollout.gpu_memory_utilization": FRACTION,
    "rollout.max_batch_size": AT_LEAST_1,
    "rollout.weight_sync_bucket_mb": AT_LEAST_1,
    "rollout.sglang.cuda_graph_max_bs": Range(0, why="0 = no CUDA graphs"),
    "rollout.sglang.max_running_requests": Range(1, why="or null = SGLang sizes it"),
    "reward.reward_scale": POSITIVE,
    "reward.timeout_s": POSITIVE,
    "reward.num_workers": AT_LEAST_1,
    "reward.overlong_buffer.len": AT_LEAST_1,
    "reward.overlong_buffer.penalty_factor": NON_NEGATIVE,
}


def numeric_leaves(cls: type = Config, prefix: str = "") -> list[str]:
    """Dotted keys of every int or float field (optional ones included) of the schema."""
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key, tp = f"{prefix}.{f.name}" if prefix else f.name, hints[f.name]
        if dataclasses.is_dataclass(tp):
            keys += numeric_leaves(tp, key)  # type: ignore[arg-type]
        elif {int, float} & set(typing.get_args(tp) or (tp,)):
            keys.append(key)
    return keys


def _value_at(obj: object, dotted: str) -> object:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def check_ranges(cfg: Config) -> None:
    """Every numeric key is finite and inside its range (null, where allowed, is not checked)."""
    for key in numeric_leaves():
        value = _value_at(cfg, key)
        if value is None or isinstance(value, bool):
            continue
        assert isinstance(value, int | float)
        if not math.isfinite(value):
            raise ConfigError(f"{key}: {value} is not a finite number")
        bound = RANGES.get(key, FINITE)
        if not bound.holds(value):
            raise ConfigError(f"{key}: {value} is out of range; it must be {bound.describe()}")
