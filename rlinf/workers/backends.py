"""YAML backend names -> dotted worker classes, imported only when chosen (CPU installs never
import Megatron or SGLang), plus a pre-flight check that names the missing package."""

from __future__ import annotations

import importlib.util

from rlinf.config.schema import Config

ACTOR_BACKENDS = {
    "torch": "rlinf.workers.actor.torch_actor:TorchActor",
    "megatron": "rlinf.workers.actor.megatron_actor:MegatronActor",
}
ROLLOUT_BACKENDS = {
    "torch": "rlinf.workers.rollout.torch_rollout:TorchRollout",
    "sglang": "rlinf.workers.rollout.sglang_rollout:SGLangRollout",
}
REWARD_WORKER = "rlinf.workers.reward.reward_worker:RewardWorker"

# Packages a backend needs beyond the embedded stack, with the command that installs them.
REQUIRED_PACKAGES = {
    ("actor", "megatron"): (("megatron.core", "megatron-core"), ("megatron.bridge", "megatron-bridge")),
    ("rollout", "sglang"): (("sglang", "sglang"),),
}
INSTALL_HINT = (
    "install the GPU stack with: bash requirements/install.sh agentic --sglang 0.5.12 --torch 2.11.0 "
    "--transformers 5.12.1 --platform nvidia --venv /opt/venv/rlinf (see docs/install.md)"
)


# Metric sinks (runner.logger.logger_backends) outside the embedded stack: (module, install command).
LOGGER_PACKAGES = {
    "wandb": (
        "wandb",
        "bash requirements/install.sh embedded --wandb (or pip install -r requirements/wandb.txt)",
    ),
}


class BackendUnavailableError(RuntimeError):
    """A recipe asks for a backend this machine cannot run."""


def missing_backend_packages(cfg: Config) -> list[str]:
    """One line per problem: which role/backend lacks which package (empty when all is there)."""
    problems = []
    for role, backend in (("actor", cfg.actor.training_backend), ("rollout", cfg.rollout.rollout_backend)):
        key = "training_backend" if role == "actor" else "rollout_backend"
        for module, package in REQUIRED_PACKAGES.get((role, backend), ()):
            if importlib.util.find_spec(module.split(".")[0]) is None or _missing(module):
                problems.append(
                    f"{role}.{key}={backend} needs the Python package '{package}' ({module}), not installed"
                )
    return problems


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True


def check_backends(cfg: Config) -> None:
    problems = missing_backend_packages(cfg)
    hints = [INSTALL_HINT] if problems else []
    for backend in cfg.runner.logger.logger_backends:
        module, install = LOGGER_PACKAGES.get(backend, (None, ""))
        if module is not None and importlib.util.find_spec(module) is None:
            problems.append(
                f"runner.logger.logger_backends: {backend} needs the Python package '{module}', not installed"
            )
            hints.append(f"install it with: {install}")
    if problems:
        raise BackendUnavailableError("\n".join(["cannot run this recipe here:", *problems, *hints]))
