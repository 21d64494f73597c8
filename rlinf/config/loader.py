"""Recipe loading: Hydra compose -> typed dataclasses -> cross-field rules -> frozen Config."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from rlinf.config.schema import Config
from rlinf.config.typed import ConfigError, from_dict, to_dict
from rlinf.config.validate import validate

RECIPE_DIR = Path(__file__).resolve().parents[2] / "examples" / "reasoning" / "config" / "math"
DEFAULT_RECIPE = "tiny-moe-grpo-cpu"


def recipe_path(recipe: str) -> Path:
    """A recipe name under examples/reasoning/config/math, or a path to a YAML file."""
    candidate = Path(recipe)
    if candidate.suffix in (".yaml", ".yml"):
        if not candidate.is_file():
            raise ConfigError(f"recipe file not found: {candidate}")
        return candidate.resolve()
    named = RECIPE_DIR / f"{recipe}.yaml"
    if not named.is_file():
        known = sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))
        raise ConfigError(f"unknown recipe {recipe!r}; recipes in {RECIPE_DIR}: {', '.join(known)}")
    return named


def _hydra_overrides(overrides: Sequence[str]) -> list[str]:
    # '++key=value' adds or overrides, so any schema key can be set even when the YAML omits it;
    # unknown keys are then caught by the typed conversion with a closest-key hint.
    return [o if o.startswith(("+", "~")) else f"++{o}" for o in overrides]


def _override_key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0].strip()


def _given_on_command_line(key: str, overrides: Sequence[str]) -> str | None:
    """The override that set `key` (or a key above or below it), if one did."""
    for override in overrides:
        given = _override_key(override)
        if given == key or given.startswith((f"{key}.", f"{key}[")) or key.startswith(f"{given}."):
            return override
    return None


def _where(message: str, overrides: Sequence[str], path: Path) -> str:
    """Where a bad key came from: the command line (naming the override) or the recipe file."""
    match = re.match(r"unknown key '([^']+)'|([\w.]+)(?:\[\d+\])?: ", message)
    override = _given_on_command_line(match.group(1) or match.group(2), overrides) if match else None
    return f"command line ({override})" if override else str(path)


def compose_recipe(recipe: str, overrides: Sequence[str] = ()) -> dict:
    """Hydra-compose a recipe plus overrides into a plain dict (no validation)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException, OverrideParseException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = recipe_path(recipe)
    try:
        with initialize_config_dir(config_dir=str(path.parent), version_base=None):
            composed = compose(config_name=path.stem, overrides=_hydra_overrides(overrides))
        data = OmegaConf.to_container(composed, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        message = " ".join(str(err).split())  # one line (Hydra adds a "See <docs>" line)
        named = [o for o in overrides if f"'{_override_key(o)}'" in message]
        if isinstance(err, OverrideParseException) or named:
            raise ConfigError(f"command line ({' '.join(named or overrides)}): {message}") from None
        raise ConfigError(f"{path}: {message}") from None
    except Exception as err:  # YAML syntax errors surface as yaml.YAMLError
        if type(err).__module__.startswith("yaml"):
            raise ConfigError(f"{path}: malformed YAML: {err}") from None
        raise
    assert isinstance(data, dict)
    data.pop("hydra", None)
    return data


def detect_local_gpus() -> int:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    if shutil.which("nvidia-smi") is None:
        return 0
    result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    gpus = [line for line in result.stdout.splitlines() if line.startswith("GPU ")]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return min(len(gpus), len(visible.split(","))) if visible else len(gpus)


def _fill_defaults(cfg: Config) -> Config:
    cluster = cfg.cluster
    if cluster.num_gpus_per_node is None:
        cluster = dataclasses.replace(cluster, num_gpus_per_node=detect_local_gpus())
    logger = cfg.runner.logger
    if logger.log_path is None:
        logger = dataclasses.replace(logger, log_path=str(Path("logs") / cfg.runner.experiment_name))
    rollout_model = cfg.rollout.model
    if not rollout_model.model_path:
        rollout_model = dataclasses.replace(rollout_model, model_path=cfg.actor.model.model_path)
    return dataclasses.replace(
        cfg,
        cluster=cluster,
        runner=dataclasses.replace(cfg.runner, logger=logger),
        rollout=dataclasses.replace(cfg.rollout, model=rollout_model),
    )


def load_config(recipe: str = DEFAULT_RECIPE, overrides: Sequence[str] = ()) -> Config:
    """Compose, type-check and validate a recipe. Raises ConfigError naming the offending key."""
    data = compose_recipe(recipe, overrides)
    try:
        cfg = from_dict(Config, data)
    except ConfigError as err:
        raise ConfigError(f"{_where(str(err), overrides, recipe_path(recipe))}: {err}") from None
    return validate(_fill_defaults(cfg))


def save_resolved_config(cfg: Config, directory: str | Path) -> Path:
    """Write the resolved recipe (every field, defaults included) as YAML next to the logs."""
    import yaml

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "resolved_config.yaml"
    tmp = out.with_suffix(".yaml.tmp")
    tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    tmp.replace(out)
    return out


def config_from_yaml_dict(data: dict) -> Config:
    """Rebuild a Config from a dict written by save_resolved_config (checkpoint resume)."""
    return from_dict(Config, data)
