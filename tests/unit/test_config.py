import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlinf.config import ConfigError, load_config, save_resolved_config
from rlinf.config.loader import RECIPE_DIR, config_from_yaml_dict
from rlinf.config.placement import parse_gpu_spec, parse_placement
from rlinf.config.reference import render_reference
from rlinf.config.validate import actor_data_parallel_size

REPO = Path(__file__).resolve().parents[2]
ALL_YAML = sorted(p for d in ("examples", "tests") for p in (REPO / d).rglob("*.yaml"))


def test_every_recipe_yaml_parses_and_validates():
    assert ALL_YAML, "no recipes found"
    for path in ALL_YAML:
        cfg = load_config(str(path))
        assert cfg.algorithm.group_size >= 2, path


def test_named_recipe_and_overrides():
    cfg = load_config(
        "tiny-moe-grpo-cpu", ["algorithm.group_size=16", "runner.seed=7", "actor.optim.lr=3e-4"]
    )
    assert cfg.algorithm.group_size == 16
    assert cfg.runner.seed == 7
    assert cfg.actor.optim.lr == pytest.approx(3e-4)
    # defaults filled in: log path from the experiment name, rollout model from the actor's
    assert cfg.runner.logger.log_path == "logs/tiny-moe-grpo-cpu"
    assert cfg.rollout.model.model_path == cfg.actor.model.model_path


def test_moonlight_recipe_fields():
    cfg = load_config("moonlight-16b-grpo-megatron")
    m = cfg.actor.model
    assert (m.tensor_model_parallel_size, m.expert_model_parallel_size, m.expert_tensor_parallel_size) == (
        8,
        8,
        1,
    )
    assert m.sequence_parallel and m.multi_latent_attention and m.moe_token_dispatcher_type == "alltoall"
    assert cfg.actor.optim.use_precision_aware_optimizer and cfg.actor.optim.lr == pytest.approx(1e-6)
    assert cfg.rollout.rollout_backend == "sglang" and cfg.rollout.sglang.enable_ep_moe
    assert cfg.rollout.tensor_parallel_size == 8
    assert (cfg.reward.reward_type, cfg.reward.reward_scale) == ("math", 5.0)
    assert (cfg.data.prompt_key, cfg.data.answer_key) == ("prompt", "solutions")
    assert actor_data_parallel_size(cfg) == 1


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("algorithm.grup_size=4", "unknown key 'algorithm.grup_size'; did you mean 'algorithm.group_size'"),
        ("actor.optim.learning_rate=1", "unknown key 'actor.optim.learning_rate'"),
        ("runner.max_step=3", "did you mean 'runner.max_steps'"),
        ("actor.micro_batch_size=abc", "actor.micro_batch_size: expected int, got str"),
        ("algorithm.normalize_advantages=3", "algorithm.normalize_advantages: expected bool, got int"),
        ("actor.model.precision=fp8", "actor.model.precision: 'fp8' is not one of"),
        ("algorithm.adv_type=ppo", "algorithm.adv_type: 'ppo' is not one of grpo, dr_grpo, rloo"),
        ("actor.global_batch_size=48", "actor.global_batch_size: 48 does not divide the 128 responses"),
        ("actor.micro_batch_size=24", "not divisible by actor.micro_batch_size (24)"),
        ("actor.seq_length=100", "actor.seq_length: 100 < data.max_prompt_length"),
        ("algorithm.group_size=1", "algorithm.group_size: 1 is out of range; it must be >= 2"),
        ("cluster.num_gpus_per_node=2", "the torch actor runs on one device but 2 GPUs are placed"),
        (
            "runner.logger.logger_backends=[mlflow]",
            "runner.logger.logger_backends: 'mlflow' is not one of tensorboard, wandb",
        ),
    ],
)
def test_bad_overrides_name_the_key(override, expected):
    with pytest.raises(ConfigError, match=None) as err:
        load_config("tiny-moe-grpo-cpu", [override])
    assert expected in str(err.value)


def test_impossible_placements(tmp_path):
    recipe = (RECIPE_DIR / "moonlight-16b-grpo-megatron.yaml").read_text()
    path = tmp_path / "too-many-gpus.yaml"
    path.write_text(recipe.replace("actor,rollout,reward: all", "actor,rollout,reward: 0-9"))
    with pytest.raises(ConfigError, match=r"GPU\(s\) \[8, 9\] requested but the cluster has 8"):
        load_config(str(path))
    with pytest.raises(ConfigError, match="TP x PP x CP = 8 does not divide the 4 GPU"):
        load_config("moonlight-16b-grpo-megatron", ["cluster.num_gpus_per_node=4"])
    with pytest.raises(ConfigError, match="sequence_parallel: must be true"):
        load_config("moonlight-16b-grpo-megatron", ["actor.model.sequence_parallel=false"])
    with pytest.raises(ConfigError, match="unknown role 'critic'"):
        parse_placement({"actor,rollout": "all", "critic": "0"}, 8)
    assert parse_gpu_spec("0-1,4-5", 8, "x") == (0, 1, 4, 5)
    assert parse_gpu_spec("all", 0, "x") == ()
    disaggregated = parse_placement({"actor": "0-3", "rollout": "4-7"}, 8)
    assert not disaggregated.is_colocated("actor", "rollout")


def test_malformed_yaml_names_the_file(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("runner:\n  seed: [1, 2\n")
    with pytest.raises(ConfigError, match="broken.yaml"):
        load_config(str(bad))


def test_unknown_key_in_yaml_file(tmp_path):
    text = (RECIPE_DIR / "tiny-moe-grpo-cpu.yaml").read_text().replace("  group_size: 8", "  group_sise: 8")
    path = tmp_path / "typo.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"typo.yaml: unknown key 'algorithm.group_sise'; did you mean"):
        load_config(str(path))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["algorithm.grup_size=3"],
            "command line (algorithm.grup_size=3): unknown key 'algorithm.grup_size'",
        ),
        (["algorithm.foo.bar=1"], "command line (algorithm.foo.bar=1): unknown key 'algorithm.foo'"),
        (
            ["runner.seed=1", "algorithm.group_size=abc"],
            "command line (algorithm.group_size=abc): algorithm.group_size: expected int, got str",
        ),
        (["runner.logger.logger_backends=[1]"], "command line (runner.logger.logger_backends=[1]): "),
        (["algorithm.group_size=[1"], "command line (algorithm.group_size=[1): no viable alternative"),
        (["~algorithm.nokey"], "command line (~algorithm.nokey): Could not delete"),
    ],
)
def test_a_bad_command_line_key_is_reported_as_one(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config("tiny-moe-grpo-cpu", overrides)
    message = str(err.value)
    assert message.startswith(expected), message
    assert ".yaml" not in message and "\n" not in message, message


def test_unknown_recipe_lists_known_ones():
    with pytest.raises(ConfigError, match="tiny-moe-grpo-cpu"):
        load_config("no-such-recipe")


def test_resolved_config_round_trip(tmp_path):
    import yaml

    cfg = load_config("moonlight-16b-grpo-megatron")
    path = save_resolved_config(cfg, tmp_path)
    assert config_from_yaml_dict(yaml.safe_load(path.read_text())) == cfg


def test_registry_names_match_validation_constants():
    from rlinf.algorithms import ADVANTAGES, KL_PENALTIES, LOSS_AGGREGATIONS, POLICY_LOSSES
    from rlinf.config import validate
    from rlinf.rewards.registry import REWARDS

    assert set(validate.ADV_TYPES) == set(ADVANTAGES.names())
    assert set(validate.LOSS_TYPES) == set(POLICY_LOSSES.names())
    assert set(validate.LOSS_AGG_FUNCS) == set(LOSS_AGGREGATIONS.names())
    assert set(validate.KL_PENALTY_TYPES) == set(KL_PENALTIES.names())
    assert set(validate.REWARD_TYPES) == set(REWARDS)


def test_configuration_reference_is_in_step_with_schema():
    page = (REPO / "docs" / "configuration.md").read_text()
    assert page == render_reference(), "regenerate: python -m rlinf.config.reference > docs/configuration.md"
    assert "| `algorithm.group_size` | `int` | `8` |" in page


def test_config_import_is_light():
    code = "import sys, rlinf.config; cfg = rlinf.config.load_config(); print(sorted(m for m in ('torch', 'ray') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def _run_main(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "examples/reasoning/main_grpo.py", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_malformed_recipe_fails_fast_before_workers():
    started = time.perf_counter()
    proc = _run_main("tiny-moe-grpo-cpu", "algorithm.grup_size=3")
    assert proc.returncode == 2
    assert "unknown key 'algorithm.grup_size'; did you mean 'algorithm.group_size'" in proc.stderr
    assert "ray" not in proc.stderr.lower()
    assert time.perf_counter() - started < 20


def test_gpu_recipe_on_cpu_names_missing_backend():
    proc = _run_main("moonlight-16b-grpo-megatron")
    assert proc.returncode == 3
    assert "actor.training_backend=megatron needs the Python package 'megatron-core'" in proc.stderr
    assert "rollout.rollout_backend=sglang needs the Python package 'sglang'" in proc.stderr
    assert "requirements/install.sh" in proc.stderr


def test_tiny_recipe_trains_on_the_task_the_tiny_model_was_warm_started_on():
    from rlinf.models.tiny import TINY_URI, TinyModelSettings

    cfg = load_config("tiny-moe-grpo-cpu")
    tiny = TinyModelSettings()
    assert cfg.actor.model.model_path == TINY_URI
    task = cfg.data.synthetic
    assert (task.digits, task.operations, task.steps) == (tiny.digits, tiny.operations, tiny.steps)


def test_gpu_recipe_validates_on_512_problems_of_gpu_tinys_warm_start_task():
    from rlinf.data.synthetic import generate_arithmetic
    from rlinf.models.tiny import GPU_TINY_SETTINGS, TINY_GPU_URI

    cfg = load_config("tiny-moe-grpo-gpu")
    gpu = GPU_TINY_SETTINGS
    assert cfg.actor.model.model_path == TINY_GPU_URI
    task = cfg.data.synthetic
    assert (task.digits, task.operations, task.steps) == (gpu.digits, gpu.operations, gpu.steps)
    # 512 problems: one seed's greedy accuracy has a standard error of about 2 points
    assert task.num_val >= 512
    shape = {"digits": task.digits, "operations": task.operations, "steps": task.steps}
    val = generate_arithmetic("val", task.num_val, seed=cfg.runner.seed, **shape)
    train = generate_arithmetic("train", task.num_train, seed=cfg.runner.seed, **shape)
    assert (len(val), len(train)) == (task.num_val, task.num_train)
    # the tiny tokenizer is character-level: a worked solution plus EOS must fit the response budget
    longest = max(len(p.worked_solution) for p in [*val, *train])
    assert longest + 1 <= cfg.algorithm.sampling_params.max_new_tokens
