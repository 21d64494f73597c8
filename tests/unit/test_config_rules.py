"""Every cross-field rule in rlinf/config/validate.py RULES is exercised by a recipe only it refuses.

Deleting a rule from RULES makes its cases fail; a new rule without a case fails
test_every_rule_has_a_case. Add a case to CASES: (rule name, recipe, overrides, message fragment).
"""

import pytest

from rlinf.config import ConfigError, load_config
from rlinf.config import validate as validate_module

TINY, MOONLIGHT = "tiny-moe-grpo-cpu", "moonlight-16b-grpo-megatron"
FILES = ["data.type=math", "data.train_data_paths=[a.jsonl]"]
COSINE = ["actor.lr_sched.lr_decay_style=cosine"]

CASES = [
    ("check_names", TINY, ["algorithm.adv_type=ppo"], "algorithm.adv_type: 'ppo' is not one of"),
    ("check_cuda_mps", TINY, ["cluster.cuda_mps=true"], "cluster.cuda_mps: true needs a GPU"),
    (
        "check_cuda_mps",
        TINY,
        ["cluster.cuda_mps=true", "cluster.num_nodes=2", "cluster.num_gpus_per_node=1"],
        "cluster.cuda_mps: the run starts one MPS daemon, on its own node; 2 nodes",
    ),
    ("check_names", TINY, ["algorithm.loss_type=dpo"], "algorithm.loss_type: 'dpo' is not one of"),
    ("check_names", TINY, ["algorithm.loss_agg_func=sum"], "algorithm.loss_agg_func: 'sum'"),
    ("check_names", TINY, ["algorithm.kl_penalty_type=k4"], "algorithm.kl_penalty_type: 'k4'"),
    ("check_names", TINY, ["reward.reward_type=code"], "reward.reward_type: 'code'"),
    ("check_names", TINY, ["actor.training_backend=jax"], "actor.training_backend: 'jax'"),
    ("check_names", TINY, ["rollout.rollout_backend=vllm"], "rollout.rollout_backend: 'vllm'"),
    ("check_names", TINY, ["actor.model.model_type=llama"], "actor.model.model_type: 'llama'"),
    ("check_names", TINY, ["rollout.model.model_type=qwen2"], "rollout.model.model_type: 'qwen2'"),
    (
        "check_names",
        TINY,
        ["runner.logger.logger_backends=[mlflow]"],
        "runner.logger.logger_backends: 'mlflow'",
    ),
    ("check_ranges", TINY, ["algorithm.group_size=1"], "algorithm.group_size: 1 is out of range"),
    ("check_ranges", TINY, ["algorithm.ratio_clip_eps=1.5"], "ratio_clip_eps: 1.5 is out of range"),
    ("check_ranges", TINY, ["algorithm.clip_ratio_c=0.5"], "algorithm.clip_ratio_c: 0.5 is out of range"),
    ("check_ranges", TINY, ["algorithm.kl_beta=-0.1"], "algorithm.kl_beta: -0.1 is out of range"),
    ("check_ranges", TINY, ["algorithm.rollout_is.clip=0"], "rollout_is.clip: 0.0 is out of range"),
    ("check_ranges", TINY, ["algorithm.val_n=0"], "algorithm.val_n: 0 is out of range; it must be >= 1"),
    ("check_ranges", TINY, ["actor.optim.lr=nan"], "actor.optim.lr: nan is not a finite number"),
    ("check_ranges", TINY, ["actor.optim.lr=-1e-5"], "actor.optim.lr: -1e-05 is out of range"),
    ("check_ranges", TINY, ["algorithm.sampling_params.top_k=0"], "it must be -1 or >= 1 (-1 = all tokens)"),
    ("check_ranges", TINY, ["data.rollout_batch_size=0"], "data.rollout_batch_size: 0 is out of range"),
    ("check_ranges", TINY, ["data.val_batch_size=0"], "data.val_batch_size: 0 is out of range"),
    (
        "check_ranges",
        TINY,
        ["runner.max_steps=0"],
        "runner.max_steps: 0 is out of range; it must be -1 or >= 1",
    ),
    ("check_ranges", TINY, ["runner.keep_checkpoints=0"], "runner.keep_checkpoints: 0 is out of range"),
    ("check_ranges", TINY, ["runner.save_interval=-1"], "runner.save_interval: -1 is out of range"),
    ("check_ranges", TINY, ["actor.num_workers=0"], "actor.num_workers: 0 is out of range"),
    (
        "check_ranges",
        TINY,
        ["algorithm.dynamic_sampling.max_gen_rounds=0"],
        "algorithm.dynamic_sampling.max_gen_rounds: 0 is out of range; it must be >= 1",
    ),
    ("check_ranges", TINY, ["reward.overlong_buffer.len=0"], "reward.overlong_buffer.len: 0 is out of range"),
    (
        "check_ranges",
        TINY,
        ["reward.overlong_buffer.penalty_factor=-1"],
        "reward.overlong_buffer.penalty_factor: -1.0 is out of range",
    ),
    (
        "check_algorithm",
        TINY,
        ["algorithm.recompute_logprobs=false", "algorithm.rollout_is.mode=token_tis"],
        "algorithm.recompute_logprobs: false leaves no actor forward",
    ),
    (
        "check_algorithm",
        TINY,
        ["algorithm.recompute_logprobs=false", "algorithm.kl_beta=0.01"],
        "algorithm.kl_beta (0.01) need",
    ),
    (
        "check_algorithm",
        TINY,
        ["algorithm.sampling_params.min_new_tokens=65"],
        "algorithm.sampling_params.min_new_tokens: 65 > max_new_tokens (64)",
    ),
    (
        "check_sequence_lengths",
        TINY,
        ["actor.seq_length=100"],
        "actor.seq_length: 100 < data.max_prompt_length (64)",
    ),
    (
        "check_placement",
        TINY,
        ["cluster.num_gpus_per_node=2"],
        "the torch actor runs on one device but 2 GPUs are placed",
    ),
    (
        "check_placement",
        MOONLIGHT,
        ["cluster.num_gpus_per_node=4"],
        "TP x PP x CP = 8 does not divide the 4 GPU",
    ),
    (
        "check_placement",
        MOONLIGHT,
        ["actor.model.expert_model_parallel_size=3"],
        "EP x ETP = 3 does not divide",
    ),
    (
        "check_megatron_settings",
        MOONLIGHT,
        ["actor.model.sequence_parallel=false"],
        "sequence_parallel: must be true",
    ),
    (
        "check_placement",
        MOONLIGHT,
        ["rollout.tensor_parallel_size=3"],
        "rollout.tensor_parallel_size: 3 does not divide the 8",
    ),
    (
        "check_actor_data_parallel",
        TINY,
        ["actor.num_workers=3"],
        "actor.global_batch_size: 64 does not split over the 3 data-parallel actor ranks",
    ),
    (
        "check_batch_sizes",
        TINY,
        ["actor.global_batch_size=48"],
        "actor.global_batch_size: 48 does not divide the 128",
    ),
    (
        "check_batch_sizes",
        TINY,
        ["actor.micro_batch_size=24"],
        "not divisible by actor.micro_batch_size (24)",
    ),
    (
        "check_micro_batch_tokens",
        TINY,
        ["actor.max_tokens_per_micro_batch=127"],
        "actor.max_tokens_per_micro_batch: 127 < the longest possible row",
    ),
    (
        "check_micro_batch_tokens",
        TINY,
        ["actor.max_tokens_per_micro_batch=512", "actor.logprob_max_tokens_per_micro_batch=127"],
        "actor.logprob_max_tokens_per_micro_batch: 127 < the longest possible row",
    ),
    (
        "check_micro_batch_tokens",
        TINY,
        ["actor.logprob_max_tokens_per_micro_batch=1024"],
        "actor.logprob_max_tokens_per_micro_batch: 1024 needs actor.max_tokens_per_micro_batch",
    ),
    (
        "check_micro_batch_tokens",
        TINY,
        ["actor.max_tokens_per_micro_batch=512", "actor.logprob_micro_batch_size=8"],
        "actor.logprob_micro_batch_size: 8 counts rows, but actor.max_tokens_per_micro_batch (512)",
    ),
    (
        "check_sglang_parallelism",
        MOONLIGHT,
        ["cluster.num_nodes=2", "rollout.tensor_parallel_size=16"],
        "does not fit the 8 GPU(s) of a node",
    ),
    (
        "check_megatron_settings",
        MOONLIGHT,
        ["actor.optim.main_params_dtype=bf16"],
        "main_params_dtype: 'bf16'",
    ),
    (
        "check_megatron_settings",
        MOONLIGHT,
        [
            "actor.model.moe_grouped_gemm_impl=torch",
            "actor.model.expert_model_parallel_size=4",
            "actor.model.expert_tensor_parallel_size=2",
        ],
        "moe_grouped_gemm_impl: rlinf's grouped-GEMM experts have no expert tensor parallelism",
    ),
    (
        "check_lr_schedule",
        TINY,
        [*COSINE, "runner.max_steps=-1"],
        "lr_decay_steps: null needs runner.max_steps > 0",
    ),
    (
        "check_lr_schedule",
        TINY,
        [*COSINE, "actor.lr_sched.lr_decay_steps=2"],
        "lr_decay_steps: 2 must exceed",
    ),
    (
        "check_routing_replay",
        TINY,
        ["algorithm.routing_replay.mode=measure", "algorithm.recompute_logprobs=false"],
        "algorithm.routing_replay.mode: measure measures routing agreement in the actor's logprob recompute",
    ),
    (
        "check_routing_replay",
        MOONLIGHT,
        ["actor.model.cuda_graph_impl=transformer_engine", "algorithm.routing_replay.mode=measure"],
        "actor.model.cuda_graph_impl: transformer_engine cannot run with algorithm.routing_replay.mode: measure",
    ),
    (
        "check_megatron_settings",
        MOONLIGHT,
        ["actor.model.cuda_graph_impl=transformer_engine", "actor.pack_sequences=true"],
        "actor.model.cuda_graph_modules: attn cannot run with actor.pack_sequences",
    ),
    (
        "check_megatron_settings",
        MOONLIGHT,
        ["actor.model.cuda_graph_impl=transformer_engine", "actor.model.recompute_granularity=full"],
        "transformer_engine cannot run with actor.model.recompute_granularity: full",
    ),
    (
        "check_partial_rollout",
        TINY,
        ["data.partial_rollout=true"],
        "data.partial_rollout: true needs data.oversample_prompts > 0",
    ),
    (
        "check_partial_rollout",
        TINY,
        ["data.partial_rollout=true", "data.oversample_prompts=2", "algorithm.routing_replay.mode=replay"],
        "data.partial_rollout: true cannot run with algorithm.routing_replay.mode: replay",
    ),
    (
        "check_dynamic_sampling",
        TINY,
        ["algorithm.dynamic_sampling.enable=true", "data.partial_rollout=true", "data.oversample_prompts=2"],
        "algorithm.dynamic_sampling.enable: true cannot run with data.partial_rollout: true",
    ),
    (
        "check_overlong_buffer",
        TINY,
        ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=64"],
        "reward.overlong_buffer.len: 64 must be < algorithm.sampling_params.max_new_tokens (64)",
    ),
    (
        "check_overlong_buffer",
        MOONLIGHT,
        ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=9000"],
        "reward.overlong_buffer.len: 9000 must be < algorithm.sampling_params.max_new_tokens (8192)",
    ),
    (
        "check_max_staleness",
        TINY,
        [
            "runner.max_staleness=1",
            "algorithm.rollout_is.mode=token_tis",
            "algorithm.dynamic_sampling.enable=true",
        ],
        "runner.max_staleness: 1 cannot run with algorithm.dynamic_sampling.enable: true",
    ),
    (
        "check_max_staleness",
        TINY,
        ["runner.stale_samples=drop"],
        "runner.stale_samples: drop acts only with runner.max_staleness >= 1",
    ),
    (
        "check_max_staleness",
        MOONLIGHT,
        ["runner.max_staleness=1"],
        "runner.max_staleness: 1 cannot run with actor.offload_between_phases: auto on a colocated placement",
    ),
    (
        "check_max_staleness",
        TINY,
        ["runner.max_staleness=1", "algorithm.recompute_logprobs=false"],
        "runner.max_staleness: 1 needs algorithm.recompute_logprobs: true",
    ),
    ("check_max_staleness", TINY, ["runner.max_staleness=1"], "needs algorithm.rollout_is.mode: token_tis"),
    (
        "check_max_staleness",
        TINY,
        [
            "runner.max_staleness=2",
            "algorithm.rollout_is.mode=token_tis",
            "data.partial_rollout=true",
            "data.oversample_prompts=2",
        ],
        "runner.max_staleness: 2 cannot run with data.partial_rollout: true",
    ),
    ("check_data", TINY, ["data.type=math"], "data.train_data_paths: empty"),
    ("check_data", TINY, FILES, "data.val_data_paths: empty but runner.val_check_interval > 0"),
    ("check_data", TINY, ["actor.model.model_path=''"], "actor.model.model_path: empty"),
    (
        "check_honoured",
        TINY,
        ["rollout.gpu_memory_utilization=0.8"],
        "rollout.gpu_memory_utilization: set to 0.8",
    ),
]
IDS = [f"{rule}:{' '.join(overrides)}" for rule, _, overrides, _ in CASES]


def test_every_rule_has_a_case():
    rules = {rule.__name__ for rule in validate_module.RULES}
    covered = {case[0] for case in CASES}
    assert not rules - covered, (
        f"rules without a case: {sorted(rules - covered)}; add (rule name, recipe, overrides, message "
        "fragment) to CASES in tests/unit/test_config_rules.py"
    )
    assert not covered - rules, f"CASES name rules that are not in validate.RULES: {sorted(covered - rules)}"


@pytest.mark.parametrize(("rule", "recipe", "overrides", "fragment"), CASES, ids=IDS)
def test_the_rule_refuses_its_case(rule, recipe, overrides, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(recipe, overrides)
    assert fragment in str(err.value)


@pytest.mark.parametrize(("rule", "recipe", "overrides", "fragment"), CASES, ids=IDS)
def test_without_the_rule_the_case_is_not_refused_that_way(rule, recipe, overrides, fragment, monkeypatch):
    # The case exercises this rule and no other: with the rule gone, that message never appears.
    others = tuple(r for r in validate_module.RULES if r.__name__ != rule)
    monkeypatch.setattr(validate_module, "RULES", others)
    try:
        load_config(recipe, overrides)
    except (ConfigError, ZeroDivisionError) as err:  # a later rule may trip over the bad value
        assert fragment not in str(err), (
            f"another rule also raises {fragment!r}: the check is duplicated; keep it in one rule"
        )
