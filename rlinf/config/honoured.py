"""Which backend honours which schema field, and which module reads it: the one declarative table.

A recipe key is a promise. For every leaf field of the schema (dotted path) this table names the
backend(s) that act on it and the module(s) whose code reads it. A "backend" is any choice the
recipe makes that decides whether a key is acted on: the actor and rollout backends, the placement,
and the data type (data.type=synthetic generates its prompts and reads no data file):

- rlinf/config/validate.py `check_honoured` refuses a recipe that sets a field to a non-default value
  when none of the field's backends is the one the recipe chose (naming the key and the backend);
- tests/unit/test_honoured.py fails when a schema field has no entry here, when an entry names a
  field that no longer exists, and when a named module does not access the field's attribute
  (`.<leaf name>`) in its code, so deleting the reader makes the test fail.

Adding a schema field: add `"section.field": (BACKEND.reads("rlinf.module.that.reads.it"),)` below.
A reader that is still being written takes `pending="who writes it"`: its check is a strict xfail
that turns into a failure the moment the reader lands, telling you to delete the `pending=`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlinf.config.placement import parse_placement
from rlinf.config.schema import Config


@dataclass(frozen=True)
class Backend:
    name: str  # as the user would name it in a message, e.g. "actor.training_backend=torch"
    active: Callable[[Config], bool]

    def reads(self, *modules: str, pending: str = "") -> Reader:
        return Reader(self, modules, pending)


@dataclass(frozen=True)
class Reader:
    backend: Backend
    modules: tuple[str, ...]  # each accesses `.<leaf name>` of the field in its code
    pending: str = ""  # non-empty: the reader is being written by this helper / issue; not there yet


def _colocated_on_gpu(cfg: Config) -> bool:
    gpus = cfg.cluster.num_nodes * (cfg.cluster.num_gpus_per_node or 0)
    placement = parse_placement(cfg.cluster.component_placement, gpus)
    return bool(placement.gpus["actor"]) and placement.is_colocated("actor", "rollout")


ANY = Backend("every backend", lambda cfg: True)
TORCH_ACTOR = Backend("actor.training_backend=torch", lambda cfg: cfg.actor.training_backend == "torch")
MEGATRON_ACTOR = Backend(
    "actor.training_backend=megatron", lambda cfg: cfg.actor.training_backend == "megatron"
)
TORCH_ROLLOUT = Backend("rollout.rollout_backend=torch", lambda cfg: cfg.rollout.rollout_backend == "torch")
SGLANG_ROLLOUT = Backend(
    "rollout.rollout_backend=sglang", lambda cfg: cfg.rollout.rollout_backend == "sglang"
)
COLOCATED_ON_GPU = Backend("actor and rollout colocated on the same GPUs", _colocated_on_gpu)
MATH_DATA = Backend("data.type=math", lambda cfg: cfg.data.type == "math")
WANDB_LOGGER = Backend(
    "runner.logger.logger_backends with wandb", lambda cfg: "wandb" in cfg.runner.logger.logger_backends
)
SYNTHETIC_DATA = Backend("data.type=synthetic", lambda cfg: cfg.data.type == "synthetic")

VALIDATE = "rlinf.config.validate"
LOADER = "rlinf.config.loader"
RUNNER = "rlinf.runners.grpo_runner"
DYNAMIC_SAMPLING = "rlinf.runners.dynamic_sampling"
PIPELINE = "rlinf.runners.pipeline"  # rollout ahead of training (runner.max_staleness)
MAIN = "rlinf.runners.main"
CHECKPOINTING = "rlinf.runners.checkpointing"
DATA_SETUP = "rlinf.runners.data_setup"
PROMPT_LOADER = "rlinf.data.prompt_loader"
POLICY_LOSS = "rlinf.algorithms.policy_loss"
# The minibatch / early-stop / NaN-skip loop every actor backend trains through.
POLICY_UPDATE = "rlinf.workers.actor.policy_update"
SAMPLING = "rlinf.workers.rollout.sampling"
REWARD_WORKER = "rlinf.workers.reward.reward_worker"
TORCH_ACTOR_MODULE = "rlinf.workers.actor.torch_actor"
MEGATRON_ACTOR_MODULE = "rlinf.workers.actor.megatron_actor"
MEGATRON_FORWARD = "rlinf.workers.actor.megatron_forward"  # the Megatron actor's batch layout and forward
MEGATRON_SETTINGS = "rlinf.config.megatron_settings"  # recipe -> Megatron provider / optimizer settings
MEGATRON_GRAPHS = "rlinf.config.megatron_graphs"  # the Megatron actor's CUDA graphs: provider fields, shape
TORCH_ROLLOUT_MODULE = "rlinf.workers.rollout.torch_rollout"
SGLANG_ROLLOUT_MODULE = "rlinf.workers.rollout.sglang_rollout"
SGLANG_ARGS = "rlinf.workers.rollout.sglang_args"  # recipe -> sglang.Engine keyword arguments


LR_SCHEDULE = "rlinf.algorithms.lr_schedule"


def _actor(megatron_module: str = MEGATRON_SETTINGS) -> tuple[Reader, ...]:
    """A trainer setting both actors must honour."""
    return (
        TORCH_ACTOR.reads(TORCH_ACTOR_MODULE),
        MEGATRON_ACTOR.reads(megatron_module),
    )


def _rollout() -> tuple[Reader, ...]:
    """A generation setting both rollouts must honour."""
    return (
        TORCH_ROLLOUT.reads(TORCH_ROLLOUT_MODULE),
        SGLANG_ROLLOUT.reads(SGLANG_ROLLOUT_MODULE),
    )


def _megatron_only() -> tuple[Reader, ...]:
    return (MEGATRON_ACTOR.reads(MEGATRON_SETTINGS),)


def _sglang_only() -> tuple[Reader, ...]:
    return (SGLANG_ROLLOUT.reads(SGLANG_ARGS),)


HONOURED: dict[str, tuple[Reader, ...]] = {
    # cluster: placement and Ray resources, backend-independent
    "cluster.num_nodes": (ANY.reads(VALIDATE),),
    "cluster.num_gpus_per_node": (ANY.reads(VALIDATE, LOADER),),
    "cluster.component_placement": (ANY.reads(VALIDATE),),
    "cluster.cuda_mps": (ANY.reads(MAIN, VALIDATE),),
    # runner: the driver loop, logging, checkpoints
    "runner.experiment_name": (ANY.reads(LOADER, CHECKPOINTING),),
    "runner.output_dir": (ANY.reads(CHECKPOINTING),),
    "runner.logger.log_path": (ANY.reads(MAIN),),
    "runner.logger.logger_backends": (ANY.reads(MAIN),),
    "runner.logger.plot": (ANY.reads(MAIN),),
    "runner.logger.wandb.project": (WANDB_LOGGER.reads(MAIN),),
    "runner.logger.wandb.name": (WANDB_LOGGER.reads(MAIN),),
    "runner.logger.wandb.tags": (WANDB_LOGGER.reads(MAIN),),
    "runner.seed": (ANY.reads(RUNNER, DATA_SETUP),),
    "runner.max_epochs": (ANY.reads(CHECKPOINTING),),  # planned_steps: the runner's and the resume probe's
    "runner.max_steps": (ANY.reads(CHECKPOINTING),),
    "runner.val_check_interval": (ANY.reads(RUNNER),),
    "runner.save_interval": (ANY.reads(RUNNER),),
    "runner.save_at_end": (ANY.reads(RUNNER),),
    "runner.keep_checkpoints": (ANY.reads(CHECKPOINTING),),
    "runner.export_hf_interval": (ANY.reads(RUNNER),),
    "runner.resume_dir": (ANY.reads(CHECKPOINTING),),
    "runner.max_consecutive_skips": (ANY.reads(POLICY_UPDATE),),
    "runner.max_staleness": (ANY.reads(RUNNER, VALIDATE),),
    "runner.stale_samples": (ANY.reads(PIPELINE, VALIDATE),),
    # algorithm: advantages on the driver, the loss in the shared policy-loss function
    "algorithm.adv_type": (ANY.reads(RUNNER),),
    "algorithm.group_size": (ANY.reads(RUNNER),),
    "algorithm.normalize_advantages": (ANY.reads(RUNNER),),
    "algorithm.loss_type": (ANY.reads(POLICY_LOSS),),
    "algorithm.loss_agg_func": (ANY.reads(POLICY_LOSS),),
    "algorithm.ratio_clip_eps": (ANY.reads(POLICY_LOSS),),
    "algorithm.clip_ratio_high": (ANY.reads(POLICY_LOSS),),
    "algorithm.clip_ratio_c": (ANY.reads(POLICY_LOSS),),
    "algorithm.kl_beta": (ANY.reads(POLICY_LOSS),),
    "algorithm.kl_penalty_type": (ANY.reads(POLICY_LOSS),),
    "algorithm.entropy_bonus": (ANY.reads(POLICY_LOSS),),
    "algorithm.early_stop_imp_ratio": (ANY.reads(POLICY_UPDATE),),
    "algorithm.rollout_is.mode": (ANY.reads(POLICY_LOSS),),
    "algorithm.rollout_is.clip": (ANY.reads(POLICY_LOSS),),
    "algorithm.recompute_logprobs": (ANY.reads(RUNNER, VALIDATE),),
    # Recorded by the rollout, replayed by the actor; validation refuses backends that cannot.
    "algorithm.routing_replay.mode": (
        TORCH_ROLLOUT.reads(TORCH_ROLLOUT_MODULE, VALIDATE),
        SGLANG_ROLLOUT.reads(SGLANG_ARGS, SGLANG_ROLLOUT_MODULE),
        TORCH_ACTOR.reads(TORCH_ACTOR_MODULE),
        MEGATRON_ACTOR.reads(MEGATRON_ACTOR_MODULE),
    ),
    # sampling: converted once into SamplingParams, which every rollout backend receives
    "algorithm.sampling_params.temperature": (ANY.reads(SAMPLING),),
    "algorithm.sampling_params.top_p": (ANY.reads(SAMPLING),),
    "algorithm.sampling_params.top_k": (ANY.reads(SAMPLING),),
    "algorithm.sampling_params.max_new_tokens": (ANY.reads(SAMPLING),),
    "algorithm.sampling_params.min_new_tokens": (ANY.reads(SAMPLING),),
    "algorithm.val_n": (ANY.reads(RUNNER),),
    # Refill rounds on the driver; the filter's metrics are registered in rlinf.algorithms.group_filter.
    "algorithm.dynamic_sampling.enable": (ANY.reads(DYNAMIC_SAMPLING),),
    "algorithm.dynamic_sampling.metric": (ANY.reads(DYNAMIC_SAMPLING),),
    "algorithm.dynamic_sampling.max_gen_rounds": (ANY.reads(DYNAMIC_SAMPLING),),
    # data: built on the driver; files for data.type=math, generated prompts for synthetic
    "data.type": (ANY.reads(DATA_SETUP),),
    "data.train_data_paths": (MATH_DATA.reads(DATA_SETUP),),
    "data.val_data_paths": (MATH_DATA.reads(DATA_SETUP),),
    "data.prompt_key": (MATH_DATA.reads(DATA_SETUP),),
    "data.answer_key": (MATH_DATA.reads(DATA_SETUP),),
    "data.apply_chat_template": (ANY.reads(DATA_SETUP),),
    "data.max_prompt_length": (ANY.reads(DATA_SETUP),),
    "data.rollout_batch_size": (ANY.reads(RUNNER),),
    "data.oversample_prompts": (ANY.reads(RUNNER),),
    "data.partial_rollout": (ANY.reads(RUNNER),),
    "data.val_batch_size": (ANY.reads(RUNNER),),
    "data.shuffle": (ANY.reads(PROMPT_LOADER),),  # training_loader
    "data.skip_invalid": (MATH_DATA.reads(DATA_SETUP),),
    "data.synthetic.digits": (SYNTHETIC_DATA.reads(DATA_SETUP),),
    "data.synthetic.operations": (SYNTHETIC_DATA.reads(DATA_SETUP),),
    "data.synthetic.steps": (SYNTHETIC_DATA.reads(DATA_SETUP),),
    "data.synthetic.num_train": (SYNTHETIC_DATA.reads(DATA_SETUP),),
    "data.synthetic.num_val": (SYNTHETIC_DATA.reads(DATA_SETUP),),
    # actor
    "actor.training_backend": (ANY.reads("rlinf.scheduler.roles"),),
    "actor.micro_batch_size": (ANY.reads(POLICY_UPDATE),),
    "actor.max_tokens_per_micro_batch": (ANY.reads(POLICY_UPDATE, VALIDATE),),
    "actor.logprob_micro_batch_size": (ANY.reads(POLICY_UPDATE, VALIDATE),),
    "actor.logprob_max_tokens_per_micro_batch": (ANY.reads(POLICY_UPDATE, VALIDATE),),
    "actor.pack_sequences": (
        TORCH_ACTOR.reads(POLICY_UPDATE, TORCH_ACTOR_MODULE),
        MEGATRON_ACTOR.reads(POLICY_UPDATE, MEGATRON_FORWARD),
    ),
    "actor.global_batch_size": (ANY.reads(POLICY_UPDATE),),
    # A bound checked before start (prompt + response must fit); Megatron also sizes buffers by it.
    "actor.seq_length": (ANY.reads(VALIDATE),),
    "actor.model.model_path": (ANY.reads(MAIN),) + _actor(MEGATRON_ACTOR_MODULE),
    # Names the architecture family; validation accepts only families the loaders support.
    "actor.model.model_type": (ANY.reads(VALIDATE),),
    "actor.model.precision": _actor(),
    "actor.model.trust_remote_code": (ANY.reads(MAIN),) + _actor(MEGATRON_ACTOR_MODULE),
    "actor.model.tensor_model_parallel_size": _megatron_only(),
    "actor.model.pipeline_model_parallel_size": _megatron_only(),
    "actor.model.expert_model_parallel_size": _megatron_only(),
    "actor.model.expert_tensor_parallel_size": _megatron_only(),
    "actor.model.context_parallel_size": _megatron_only(),
    "actor.model.sequence_parallel": _megatron_only(),
    "actor.model.multi_latent_attention": _megatron_only(),
    "actor.model.moe_token_dispatcher_type": _megatron_only(),
    "actor.model.recompute_granularity": _megatron_only(),
    "actor.model.recompute_modules": _megatron_only(),
    "actor.model.moe_router_bias_update_rate": _megatron_only(),
    "actor.model.moe_grouped_gemm": _megatron_only(),
    "actor.model.moe_grouped_gemm_impl": _megatron_only(),
    "actor.model.cuda_graph_impl": (MEGATRON_ACTOR.reads(MEGATRON_GRAPHS),),
    "actor.model.cuda_graph_modules": (MEGATRON_ACTOR.reads(MEGATRON_GRAPHS),),
    "actor.optim.optimizer": _actor(MEGATRON_ACTOR_MODULE),
    "actor.optim.lr": _actor(),
    "actor.optim.weight_decay": _actor(),
    "actor.optim.adam_beta1": _actor(),
    "actor.optim.adam_beta2": _actor(),
    "actor.optim.adam_eps": _actor(),
    "actor.optim.clip_grad": (ANY.reads(POLICY_UPDATE),),
    "actor.optim.use_distributed_optimizer": _megatron_only(),
    "actor.optim.use_precision_aware_optimizer": _megatron_only(),
    "actor.optim.main_params_dtype": _megatron_only(),
    "actor.optim.main_grads_dtype": _megatron_only(),
    "actor.optim.exp_avg_dtype": _megatron_only(),
    "actor.optim.exp_avg_sq_dtype": _megatron_only(),
    # Both actors build their schedule with rlinf.algorithms.lr_schedule.lr_multiplier_from_config.
    **{
        f"actor.lr_sched.{leaf}": (TORCH_ACTOR.reads(LR_SCHEDULE), MEGATRON_ACTOR.reads(LR_SCHEDULE))
        for leaf in ("lr_decay_style", "lr_warmup_steps", "lr_decay_steps", "min_lr_ratio")
    },
    # The driver compares the schedules before Ray starts and hands the actors the config to follow.
    "actor.lr_sched.on_resume": (ANY.reads("rlinf.runners.lr_resume"),),
    "actor.offload_between_phases": (COLOCATED_ON_GPU.reads(RUNNER),),
    "actor.num_workers": (TORCH_ACTOR.reads("rlinf.scheduler.roles"),),
    # CPU threads of the embedded workers (both run torch ops on the CPU when there is no GPU).
    "actor.num_threads": (
        TORCH_ACTOR.reads(TORCH_ACTOR_MODULE),
        TORCH_ROLLOUT.reads(TORCH_ROLLOUT_MODULE),
    ),
    # rollout
    "rollout.rollout_backend": (ANY.reads("rlinf.scheduler.roles"),),
    "rollout.model.model_path": _rollout(),
    "rollout.model.model_type": (ANY.reads(VALIDATE),),
    "rollout.model.precision": (TORCH_ROLLOUT.reads(TORCH_ROLLOUT_MODULE), SGLANG_ROLLOUT.reads(SGLANG_ARGS)),
    "rollout.tensor_parallel_size": (SGLANG_ROLLOUT.reads("rlinf.scheduler.roles", SGLANG_ARGS),),
    "rollout.gpu_memory_utilization": _sglang_only(),
    "rollout.max_batch_size": (TORCH_ROLLOUT.reads(TORCH_ROLLOUT_MODULE),),
    "rollout.weight_sync_bucket_mb": (ANY.reads(RUNNER, CHECKPOINTING),),
    "rollout.sglang.enable_ep_moe": _sglang_only(),
    "rollout.sglang.attention_backend": _sglang_only(),
    "rollout.sglang.decode_attention_backend": _sglang_only(),
    "rollout.sglang.cuda_graph_max_bs": _sglang_only(),
    "rollout.sglang.max_running_requests": _sglang_only(),
    "rollout.sglang.deterministic_inference": _sglang_only(),
    # reward
    "reward.reward_type": (ANY.reads(REWARD_WORKER),),
    "reward.reward_scale": (ANY.reads(REWARD_WORKER),),
    "reward.timeout_s": (ANY.reads(REWARD_WORKER),),
    "reward.num_workers": (ANY.reads(REWARD_WORKER),),
    "reward.overlong_buffer.enable": (ANY.reads(REWARD_WORKER),),
    "reward.overlong_buffer.len": (ANY.reads(REWARD_WORKER, VALIDATE),),
    "reward.overlong_buffer.penalty_factor": (ANY.reads(REWARD_WORKER),),
}


def honoured_by(key: str) -> str:
    """Human-readable list of the backends honouring `key` (for messages and the reference page)."""
    names = dict.fromkeys(reader.backend.name for reader in HONOURED[key])
    return ", ".join(names)


def chosen_backends(cfg: Config) -> str:
    return (
        f"actor.training_backend={cfg.actor.training_backend}, "
        f"rollout.rollout_backend={cfg.rollout.rollout_backend}, data.type={cfg.data.type}"
    )
