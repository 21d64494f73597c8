"""Cross-field rules, each a named function, all run before any worker starts."""

from __future__ import annotations

import logging
from collections.abc import Callable

from rlinf.config.honoured import HONOURED, chosen_backends, honoured_by
from rlinf.config.megatron_graphs import routing_replay_problem
from rlinf.config.placement import Placement, parse_placement
from rlinf.config.ranges import check_ranges
from rlinf.config.schema import Config
from rlinf.config.typed import ConfigError

# Names the registries in rlinf/algorithms and rlinf/rewards provide; a unit test keeps them equal,
# so validation needs no torch import.
ADV_TYPES = ("grpo", "dr_grpo", "rloo")
LOSS_TYPES = ("actor",)
LOSS_AGG_FUNCS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_PENALTY_TYPES = ("k1", "k2", "k3", "low_var_kl")
REWARD_TYPES = ("math",)
TRAINING_BACKENDS = ("torch", "megatron")
ROLLOUT_BACKENDS = ("torch", "sglang")
MODEL_TYPES = ("deepseek_v3",)
LOGGER_BACKENDS = ("tensorboard", "wandb")
# Backends that record (rollout) and replay (actor) MoE routing (algorithm.routing_replay).
ROUTING_RECORDING_ROLLOUTS = ("torch", "sglang")
ROUTING_REPLAYING_ACTORS = ("torch", "megatron")


def total_gpus(cfg: Config) -> int:
    return cfg.cluster.num_nodes * (cfg.cluster.num_gpus_per_node or 0)


def placement_of(cfg: Config) -> Placement:
    return parse_placement(cfg.cluster.component_placement, total_gpus(cfg))


def actor_data_parallel_size(cfg: Config) -> int:
    gpus = len(placement_of(cfg).gpus["actor"])
    if cfg.actor.training_backend == "torch":
        return cfg.actor.num_workers
    if gpus == 0:
        return 1
    m = cfg.actor.model
    return gpus // (m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size)


def _one_of(where: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(allowed)}")


def check_names(cfg: Config) -> None:
    a = cfg.algorithm
    _one_of("algorithm.adv_type", a.adv_type, ADV_TYPES)
    _one_of("algorithm.loss_type", a.loss_type, LOSS_TYPES)
    _one_of("algorithm.loss_agg_func", a.loss_agg_func, LOSS_AGG_FUNCS)
    _one_of("algorithm.kl_penalty_type", a.kl_penalty_type, KL_PENALTY_TYPES)
    _one_of("reward.reward_type", cfg.reward.reward_type, REWARD_TYPES)
    _one_of("actor.training_backend", cfg.actor.training_backend, TRAINING_BACKENDS)
    _one_of("rollout.rollout_backend", cfg.rollout.rollout_backend, ROLLOUT_BACKENDS)
    _one_of("actor.model.model_type", cfg.actor.model.model_type, MODEL_TYPES)
    _one_of("rollout.model.model_type", cfg.rollout.model.model_type, MODEL_TYPES)
    for backend in cfg.runner.logger.logger_backends:
        _one_of("runner.logger.logger_backends", backend, LOGGER_BACKENDS)


def check_algorithm(cfg: Config) -> None:
    a, s = cfg.algorithm, cfg.algorithm.sampling_params
    if not a.recompute_logprobs and (a.rollout_is.mode != "none" or a.kl_beta > 0):
        raise ConfigError(
            "algorithm.recompute_logprobs: false leaves no actor forward before training, which "
            f"algorithm.rollout_is.mode ({a.rollout_is.mode!r}) and algorithm.kl_beta ({a.kl_beta}) need: "
            "set rollout_is.mode: none and kl_beta: 0, or recompute_logprobs: true"
        )
    if s.min_new_tokens > s.max_new_tokens:
        raise ConfigError(
            f"algorithm.sampling_params.min_new_tokens: {s.min_new_tokens} > max_new_tokens ({s.max_new_tokens})"
        )


def check_routing_replay(cfg: Config) -> None:
    """Routing replay needs a rollout that records experts, an actor that replays them, (to
    measure) the logprob recompute, and no CUDA graphs in the Megatron actor. A dense model is
    refused where its config is read (runners.main)."""
    mode, a = cfg.algorithm.routing_replay.mode, cfg.algorithm
    if mode == "none":
        return
    key = f"algorithm.routing_replay.mode: {mode}"
    if cfg.rollout.rollout_backend not in ROUTING_RECORDING_ROLLOUTS:
        raise ConfigError(
            f"{key} needs a rollout that records each token's experts; rollout.rollout_backend="
            f"{cfg.rollout.rollout_backend} cannot (these can: {', '.join(ROUTING_RECORDING_ROLLOUTS)})"
        )
    if cfg.actor.training_backend not in ROUTING_REPLAYING_ACTORS:
        raise ConfigError(
            f"{key} needs an actor that replays recorded experts; actor.training_backend="
            f"{cfg.actor.training_backend} cannot (these can: {', '.join(ROUTING_REPLAYING_ACTORS)})"
        )
    if mode == "measure" and not a.recompute_logprobs:
        raise ConfigError(
            f"{key} measures routing agreement in the actor's logprob recompute, which "
            "algorithm.recompute_logprobs: false skips; set recompute_logprobs: true (or mode: replay)"
        )
    if problem := routing_replay_problem(cfg):
        raise ConfigError(problem)


def check_lr_schedule(cfg: Config) -> None:
    s = cfg.actor.lr_sched
    if s.lr_decay_style != "cosine":
        return
    if s.lr_decay_steps is None and cfg.runner.max_steps <= 0:
        raise ConfigError(
            "actor.lr_sched.lr_decay_steps: null needs runner.max_steps > 0 to decay over the run's "
            f"optimizer steps (runner.max_steps: {cfg.runner.max_steps}); set lr_decay_steps"
        )
    if s.lr_decay_steps is not None and s.lr_decay_steps <= s.lr_warmup_steps:
        raise ConfigError(
            f"actor.lr_sched.lr_decay_steps: {s.lr_decay_steps} must exceed lr_warmup_steps ({s.lr_warmup_steps})"
        )


def check_sequence_lengths(cfg: Config) -> None:
    total = cfg.data.max_prompt_length + cfg.algorithm.sampling_params.max_new_tokens
    if total > cfg.actor.seq_length:
        raise ConfigError(
            f"actor.seq_length: {cfg.actor.seq_length} < data.max_prompt_length ({cfg.data.max_prompt_length}) "
            f"+ algorithm.sampling_params.max_new_tokens ({cfg.algorithm.sampling_params.max_new_tokens})"
        )


def check_batch_sizes(cfg: Config) -> None:
    responses = cfg.data.rollout_batch_size * cfg.algorithm.group_size
    gbs, mbs, dp = cfg.actor.global_batch_size, cfg.actor.micro_batch_size, actor_data_parallel_size(cfg)
    if responses % gbs:
        raise ConfigError(
            f"actor.global_batch_size: {gbs} does not divide the {responses} responses per step "
            f"(data.rollout_batch_size {cfg.data.rollout_batch_size} x algorithm.group_size {cfg.algorithm.group_size})"
        )
    if cfg.actor.max_tokens_per_micro_batch is None and gbs % (mbs * dp):
        raise ConfigError(
            f"actor.global_batch_size: {gbs} is not divisible by actor.micro_batch_size ({mbs}) "
            f"x data-parallel size ({dp})"
        )


def check_micro_batch_tokens(cfg: Config) -> None:
    """A token budget per micro-batch holds the longest row a step can have (it runs alone); the
    logprob pass's own size applies to the way micro-batches are formed (rows or a budget)."""
    actor = cfg.actor
    budget = actor.max_tokens_per_micro_batch
    prompt, response = cfg.data.max_prompt_length, cfg.algorithm.sampling_params.max_new_tokens
    for key, value in (
        ("max_tokens_per_micro_batch", budget),
        ("logprob_max_tokens_per_micro_batch", actor.logprob_max_tokens_per_micro_batch),
    ):
        if value is not None and value < prompt + response:
            raise ConfigError(
                f"actor.{key}: {value} < the longest possible row, data.max_prompt_length "
                f"({prompt}) + algorithm.sampling_params.max_new_tokens ({response}) = {prompt + response} tokens; "
                "raise it, or set null"
            )
    if budget is None and actor.logprob_max_tokens_per_micro_batch is not None:
        raise ConfigError(
            f"actor.logprob_max_tokens_per_micro_batch: {actor.logprob_max_tokens_per_micro_batch} needs "
            "actor.max_tokens_per_micro_batch (micro-batches by tokens); without it the logprob pass takes "
            "actor.logprob_micro_batch_size rows"
        )
    if budget is not None and actor.logprob_micro_batch_size is not None:
        raise ConfigError(
            f"actor.logprob_micro_batch_size: {actor.logprob_micro_batch_size} counts rows, but "
            f"actor.max_tokens_per_micro_batch ({budget}) forms micro-batches by tokens; set it to null "
            "(the logprob pass then takes the training budget, or actor.logprob_max_tokens_per_micro_batch)"
        )


def check_actor_data_parallel(cfg: Config) -> None:
    """The step's responses split evenly over the data-parallel ranks."""
    workers, gpus = cfg.actor.num_workers, len(placement_of(cfg).gpus["actor"])
    if cfg.actor.training_backend == "torch" and gpus and workers != gpus:
        raise ConfigError(
            f"actor.num_workers: {workers} torch actor worker(s) need one GPU each but {gpus} GPU(s) are "
            "placed for the actor (cluster.component_placement)"
        )
    dp, gbs = actor_data_parallel_size(cfg), cfg.actor.global_batch_size
    if gbs % dp:
        raise ConfigError(
            f"actor.global_batch_size: {gbs} does not split over the {dp} data-parallel actor ranks "
            "(actor.num_workers, or GPUs / (TP x PP x CP) for megatron)"
        )


def check_placement(cfg: Config) -> None:
    placement = placement_of(cfg)  # raises on bad ranges / unknown roles
    actor_gpus, rollout_gpus = len(placement.gpus["actor"]), len(placement.gpus["rollout"])
    workers = cfg.actor.num_workers
    if cfg.actor.training_backend == "torch" and actor_gpus > 1 and actor_gpus != workers:
        raise ConfigError(
            f"cluster.component_placement: the torch actor runs on one device but {actor_gpus} GPUs are placed "
            f"(actor.num_workers={workers}); set actor.num_workers={actor_gpus} for data parallelism "
            "or use actor.training_backend=megatron"
        )
    if cfg.rollout.rollout_backend == "torch" and rollout_gpus > 1:
        raise ConfigError(
            f"cluster.component_placement: the torch rollout runs on one device but {rollout_gpus} GPUs are placed; "
            "use rollout.rollout_backend=sglang for several GPUs"
        )
    if cfg.actor.training_backend == "megatron":
        m = cfg.actor.model
        model_parallel = (
            m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size
        )
        if actor_gpus == 0 or actor_gpus % model_parallel:
            raise ConfigError(
                f"actor.model: TP x PP x CP = {model_parallel} does not divide the {actor_gpus} GPU(s) placed "
                "for the actor (cluster.component_placement, cluster.num_gpus_per_node)"
            )
        expert_parallel = m.expert_model_parallel_size * m.expert_tensor_parallel_size
        if (actor_gpus // m.pipeline_model_parallel_size) % expert_parallel:
            raise ConfigError(
                f"actor.model: EP x ETP = {expert_parallel} does not divide the "
                f"{actor_gpus // m.pipeline_model_parallel_size} GPU(s) of a pipeline stage"
            )
    if cfg.rollout.rollout_backend == "sglang":
        tp = cfg.rollout.tensor_parallel_size
        if rollout_gpus == 0 or rollout_gpus % tp:
            raise ConfigError(
                f"rollout.tensor_parallel_size: {tp} does not divide the {rollout_gpus} GPU(s) placed for the rollout"
            )


def check_cuda_mps(cfg: Config) -> None:
    if not cfg.cluster.cuda_mps:
        return
    if total_gpus(cfg) == 0:
        raise ConfigError(
            "cluster.cuda_mps: true needs a GPU; this cluster has none (cluster.num_gpus_per_node)"
        )
    if cfg.cluster.num_nodes > 1:
        raise ConfigError(
            f"cluster.cuda_mps: the run starts one MPS daemon, on its own node; {cfg.cluster.num_nodes} nodes "
            "need one each (nvidia-cuda-mps-control -d on every node before ray start)"
        )


def check_sglang_parallelism(cfg: Config) -> None:
    """An SGLang engine's TP (and EP, = TP when rollout.sglang.enable_ep_moe) GPUs sit on one node."""
    if cfg.rollout.rollout_backend != "sglang":
        return
    tp, per_node = cfg.rollout.tensor_parallel_size, cfg.cluster.num_gpus_per_node or 0
    what = "tensor x expert parallel" if cfg.rollout.sglang.enable_ep_moe and tp > 1 else "tensor parallel"
    if per_node and (tp > per_node or per_node % tp):
        raise ConfigError(
            f"rollout.tensor_parallel_size: {tp} ({what}) does not fit the {per_node} GPU(s) of a node "
            "(cluster.num_gpus_per_node); one SGLang engine runs on the GPUs of one node"
        )


def check_partial_rollout(cfg: Config) -> None:
    """Groups are carried only when the quota ends a step early, and a carried response's routing
    is not recorded across steps (the continuation's prompt would hold unrecorded tokens)."""
    d = cfg.data
    if not d.partial_rollout:
        return
    if d.oversample_prompts == 0:
        raise ConfigError(
            "data.partial_rollout: true needs data.oversample_prompts > 0 (without extra prompts the "
            "rollout never ends early, so there is nothing to carry)"
        )
    if cfg.algorithm.routing_replay.mode != "none":
        raise ConfigError(
            f"data.partial_rollout: true cannot run with algorithm.routing_replay.mode: "
            f"{cfg.algorithm.routing_replay.mode} (a carried response's routing is not recorded across "
            "steps); turn one of them off"
        )


def check_dynamic_sampling(cfg: Config) -> None:
    """A refill round is a fresh draw; a partial rollout's carried groups belong to one step's quota."""
    if cfg.algorithm.dynamic_sampling.enable and cfg.data.partial_rollout:
        raise ConfigError(
            "algorithm.dynamic_sampling.enable: true cannot run with data.partial_rollout: true (groups "
            "carried between steps would be dropped or refilled out of turn); turn one of them off"
        )


def check_overlong_buffer(cfg: Config) -> None:
    """The penalty ramps over the last `len` tokens below the response cap, so it must fit under it."""
    buffer, cap = cfg.reward.overlong_buffer, cfg.algorithm.sampling_params.max_new_tokens
    if buffer.enable and buffer.len >= cap:
        raise ConfigError(
            f"reward.overlong_buffer.len: {buffer.len} must be < algorithm.sampling_params.max_new_tokens "
            f"({cap}): the penalty ramps over the last len tokens below the response length limit"
        )


def check_max_staleness(cfg: Config) -> None:
    """Rollout ahead of training (runner.max_staleness >= 1) needs both roles up at once, and a loss
    that corrects for the older policy that sampled: the recomputed logprobs are the proximal policy
    the PPO ratio clips against, and token_tis weighs each token by proximal / behaviour (the
    decoupled PPO objective, with the behaviour weight truncated; docs/rollout.md)."""
    k, r = cfg.runner.max_staleness, cfg.runner
    if k == 0:
        if r.stale_samples != "regenerate":
            raise ConfigError(
                f"runner.stale_samples: {r.stale_samples} acts only with runner.max_staleness >= 1 "
                "(at 0 the loop is synchronous and no sample is ever stale); remove it"
            )
        return
    where = f"runner.max_staleness: {k}"
    if _colocated_on_gpu(cfg) and cfg.actor.offload_between_phases is not False:
        raise ConfigError(
            f"{where} cannot run with actor.offload_between_phases: {cfg.actor.offload_between_phases} on "
            "a colocated placement: the rollout generates while the actor trains, so neither can give "
            "the GPUs to the other; set actor.offload_between_phases: false (both resident), place them "
            "on separate GPUs, or set runner.max_staleness: 0"
        )
    if not cfg.algorithm.recompute_logprobs:
        raise ConfigError(
            f"{where} needs algorithm.recompute_logprobs: true (the current policy's logprobs are the "
            "proximal policy the PPO ratio clips against; the rollout's are of an older one)"
        )
    if cfg.algorithm.rollout_is.mode == "none":
        raise ConfigError(
            f"{where} needs algorithm.rollout_is.mode: token_tis (the importance weight that corrects "
            "for the older policy that sampled; without it the loss ignores the lag)"
        )
    if cfg.data.partial_rollout:
        raise ConfigError(
            f"{where} cannot run with data.partial_rollout: true (a carried response mixes tokens of "
            "several policy versions, which the staleness bound does not track yet)"
        )
    if cfg.algorithm.dynamic_sampling.enable:
        raise ConfigError(
            f"{where} cannot run with algorithm.dynamic_sampling.enable: true (the pipeline's producer "
            "generates one round a step; refill rounds ahead of training are not built yet)"
        )


def _colocated_on_gpu(cfg: Config) -> bool:
    placement = placement_of(cfg)
    return bool(placement.gpus["actor"]) and placement.is_colocated("actor", "rollout")


def check_data(cfg: Config) -> None:
    d = cfg.data
    if d.type == "math" and not d.train_data_paths:
        raise ConfigError("data.train_data_paths: empty; data.type=math reads prompts from files")
    if cfg.runner.val_check_interval > 0 and d.type == "math" and not d.val_data_paths:
        raise ConfigError("data.val_data_paths: empty but runner.val_check_interval > 0")
    if not cfg.actor.model.model_path:
        raise ConfigError("actor.model.model_path: empty; give an HF checkpoint dir or tiny://bootstrap")


def _value_at(obj: object, dotted: str) -> object:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def check_honoured(cfg: Config) -> None:
    """A key set away from its default must be read by a backend this recipe runs (rlinf/config/honoured.py)."""
    default = Config()
    for key, readers in HONOURED.items():
        value = _value_at(cfg, key)
        if value == _value_at(default, key) or any(r.backend.active(cfg) for r in readers):
            continue
        raise ConfigError(
            f"{key}: set to {value!r}, but this recipe ignores it ({chosen_backends(cfg)}, "
            f"{total_gpus(cfg)} GPU(s)); it is honoured only by: {honoured_by(key)}. "
            f"Remove the key, or choose {honoured_by(key)}"
        )


def check_megatron_settings(cfg: Config) -> None:
    """Parallelism and optimizer-precision choices megatron-core cannot run (fp32/fp16 masters only)."""
    if cfg.actor.training_backend != "megatron":
        return
    from rlinf.config.megatron_settings import model_problems, precision_problems

    # TE presence is decided on the worker; here assume it, so only recipe-level problems show.
    problems = model_problems(cfg.actor, te_available=True) + precision_problems(cfg.actor.optim)
    if problems:
        raise ConfigError("\n".join(problems))


RULES: tuple[Callable[[Config], None], ...] = (
    check_ranges,  # first: the rules below may divide by a size or compare with a NaN
    check_names,
    check_cuda_mps,
    check_algorithm,
    check_routing_replay,
    check_partial_rollout,
    check_dynamic_sampling,
    check_overlong_buffer,
    check_lr_schedule,
    check_sequence_lengths,
    check_placement,
    check_max_staleness,  # after check_placement: it reads the placement
    check_actor_data_parallel,
    check_batch_sizes,
    check_micro_batch_tokens,
    check_sglang_parallelism,
    check_megatron_settings,
    check_data,
    check_honoured,
)


def biased_sampling_keys(cfg: Config) -> list[str]:
    """The sampling keys set so that tokens are drawn from a distribution other than the one whose
    logprobs rollout and actor both report (the untruncated tempered one; docs/rollout.md)."""
    s = cfg.algorithm.sampling_params
    keys = [f"top_k={s.top_k}"] if s.top_k != -1 else []
    keys += [f"top_p={s.top_p}"] if s.top_p < 1.0 else []
    keys += [f"min_new_tokens={s.min_new_tokens}"] if s.min_new_tokens > 0 else []
    return [f"algorithm.sampling_params.{key}" for key in keys]


_warned_sampling: set[tuple[str, ...]] = set()


def warn_biased_sampling(cfg: Config) -> None:
    """Warn (once per process and setting) that truncated sampling is not corrected by the loss."""
    keys = tuple(biased_sampling_keys(cfg))
    if not keys or keys in _warned_sampling:
        return
    _warned_sampling.add(keys)
    logging.getLogger(__name__).warning(
        "%s: tokens are sampled from the truncated / EOS-masked distribution, but rollout and actor "
        "logprobs are both of the untruncated tempered distribution, so neither the PPO ratio nor "
        "algorithm.rollout_is corrects the difference (a bias; see docs/rollout.md, 'Logprob convention')",
        ", ".join(keys),
    )


def validate(cfg: Config) -> Config:
    for rule in RULES:
        rule(cfg)
    warn_biased_sampling(cfg)
    return cfg
