"""moonlight-16b-dapo-megatron is moonlight-16b-grpo-megatron plus DAPO's choices and nothing else."""

from rlinf.config import load_config
from rlinf.config.typed import to_dict


def _leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else key
        out.update(_leaves(value, dotted) if isinstance(value, dict) and value else {dotted: value})
    return out


def test_the_dapo_recipe_changes_only_the_dapo_keys():
    seed = _leaves(to_dict(load_config("moonlight-16b-grpo-megatron")))
    dapo = _leaves(to_dict(load_config("moonlight-16b-dapo-megatron")))
    changed = {key: (seed[key], dapo[key]) for key in seed if seed[key] != dapo[key]}
    assert changed == {
        "runner.experiment_name": ("moonlight-16b-grpo-megatron", "moonlight-16b-dapo-megatron"),
        "runner.logger.log_path": ("logs/moonlight-16b-grpo-megatron", "logs/moonlight-16b-dapo-megatron"),
        "algorithm.dynamic_sampling.enable": (False, True),
        "algorithm.dynamic_sampling.metric": ("reward", "accuracy"),
        "reward.overlong_buffer.enable": (False, True),
        "reward.overlong_buffer.len": (4096, 2048),
        "reward.overlong_buffer.penalty_factor": (1.0, 5.0),
    }
    # Clip-higher (DAPO's eps_low 0.2, eps_high 0.28) is on in both.
    assert (dapo["algorithm.ratio_clip_eps"], dapo["algorithm.clip_ratio_high"]) == (0.2, 0.28)
    # The penalty ramps over the last len tokens of the recipe's own response limit.
    assert dapo["algorithm.sampling_params.max_new_tokens"] == 8192
