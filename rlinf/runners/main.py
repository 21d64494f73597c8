"""Entry point behind examples/reasoning/main_grpo.py: config -> data -> Ray workers -> GRPO loop."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

from rlinf.config import DEFAULT_RECIPE, ConfigError, load_config, save_resolved_config
from rlinf.workers.backends import BackendUnavailableError, check_backends

logger = logging.getLogger("rlinf")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="GRPO training for math reasoning. Overrides use Hydra syntax: algorithm.group_size=16",
    )
    parser.add_argument("recipe", nargs="?", default=DEFAULT_RECIPE, help="recipe name or YAML path")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A recipe name given as key=value means "default recipe + overrides".
    if "=" in args.recipe:
        args.overrides.insert(0, args.recipe)
        args.recipe = DEFAULT_RECIPE
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.recipe, args.overrides)
        check_backends(cfg)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except BackendUnavailableError as err:
        print(str(err), file=sys.stderr)
        return 3
    return run(cfg)


def with_resolved_model_paths(cfg, resolve):
    actor_model = replace(cfg.actor.model, model_path=resolve(cfg.actor.model.model_path))
    rollout_model = replace(cfg.rollout.model, model_path=resolve(cfg.rollout.model.model_path))
    return replace(
        cfg,
        actor=replace(cfg.actor, model=actor_model),
        rollout=replace(cfg.rollout, model=rollout_model),
    )


def describe_failure(err: Exception, last_good: Path | None) -> str:
    return f"run stopped: {err}\nlast good checkpoint: {last_good or 'none (no checkpoint was saved)'}"


def run(cfg) -> int:
    from rlinf.config.validate import total_gpus
    from rlinf.models.loader import load_tokenizer
    from rlinf.models.tiny import resolve_model_path
    from rlinf.runners.data_setup import build_datasets
    from rlinf.runners.grpo_runner import GRPORunner
    from rlinf.scheduler.cluster import init_ray, shutdown_ray
    from rlinf.scheduler.roles import launch_roles
    from rlinf.scheduler.worker_group import WorkerError
    from rlinf.utils.metrics import MetricLogger
    from rlinf.utils.plot import plot_training_curves

    # Built (or fetched from cache) here, so its progress bar shows in this console; the workers
    # then load the concrete directory.
    cfg = with_resolved_model_paths(cfg, resolve_model_path)
    model_path = cfg.actor.model.model_path
    log_path = Path(cfg.runner.logger.log_path)
    save_resolved_config(cfg, log_path)
    tokenizer = load_tokenizer(model_path, trust_remote_code=cfg.actor.model.trust_remote_code)
    train_set, val_set, data_counters = build_datasets(cfg, tokenizer)
    metrics = MetricLogger(log_path, cfg.runner.logger.logger_backends)
    owns_ray = init_ray(total_gpus(cfg))
    runner, roles = None, None
    try:
        roles = launch_roles(cfg)
        runner = GRPORunner(cfg, roles, train_set, val_set, metrics)
        metrics.log(data_counters, step=0)
        last = runner.run()
    except WorkerError as err:
        print(describe_failure(err, runner.checkpointer.last_saved if runner else None), file=sys.stderr)
        return 1
    finally:
        metrics.close()
        if roles is not None:
            roles.shutdown()
        if owns_ray:
            shutdown_ray()
    if cfg.runner.logger.plot:
        plot = plot_training_curves(metrics.history(), log_path / "training_curves.png")
        print(f"plot: {plot}")
    print(f"TensorBoard logs: {log_path}  (tensorboard --logdir {log_path.parent})\ncheckpoint: {last}")
    return 0
