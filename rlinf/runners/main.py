"""Entry point behind examples/reasoning/main_grpo.py: config -> data -> output folders -> Ray
workers -> GRPO loop.

Bad input (recipe, data, model or checkpoint) ends with one line naming the file or key and the
problem, and a distinct exit code (rlinf.config.exit_codes). Everything the driver can check is
checked before anything is written and before Ray starts, so a refused run leaves nothing behind.
The output folders are locked for this run and probed for writing before Ray starts too
(rlinf.runners.output_setup); a save that fails later names the last good checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

from rlinf.config import DEFAULT_RECIPE, exit_codes, load_config, save_resolved_config
from rlinf.utils.signals import stop_on_sigterm, stopped_by
from rlinf.workers.backends import BackendUnavailableError, check_backends

logger = logging.getLogger("rlinf")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="GRPO training for math reasoning. Overrides use Hydra syntax: algorithm.group_size=16",
        epilog="exit codes: "
        + ", ".join(f"{code} {name}" for code, name, _ in exit_codes.TABLE)
        + " (docs/configuration.md, 'Exit codes')",
    )
    parser.add_argument("recipe", nargs="?", default=DEFAULT_RECIPE, help="recipe name or YAML path")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    stop_on_sigterm()
    try:
        return _main(argv)
    except KeyboardInterrupt as err:  # before Ray started (after it, _train reports)
        stop = stopped_by(err)
        if stop is None:  # Ctrl-C: main_grpo.py says "interrupted"
            raise
        print(f"{stop}: the run had not started training; nothing was saved", file=sys.stderr)
        return 128 + stop.signum


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    # A recipe name given as key=value means "default recipe + overrides".
    if "=" in args.recipe:
        args.overrides.insert(0, args.recipe)
        args.recipe = DEFAULT_RECIPE
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.recipe, args.overrides)
        check_backends(cfg)
    except BackendUnavailableError as err:
        print(str(err), file=sys.stderr)
        return exit_codes.BACKEND
    except Exception as err:
        return _report_input_error(err)
    return run(cfg)


def classify_input_error(err: BaseException) -> tuple[int, str] | None:
    """(exit code, label) for bad user input; None for anything else (a bug keeps its traceback)."""
    from rlinf.config.typed import ConfigError
    from rlinf.data.records import DatasetError
    from rlinf.models.hf_checkpoint import ModelLoadError
    from rlinf.utils.checkpoint import CheckpointError

    for error_type, code, label in (
        (ConfigError, exit_codes.CONFIG, "config error"),
        (DatasetError, exit_codes.DATA, "data error"),
        (CheckpointError, exit_codes.CHECKPOINT, "checkpoint error"),
        (ModelLoadError, exit_codes.MODEL, "model error"),
    ):
        if isinstance(err, error_type):
            return code, label
    return None


def _report_input_error(err: Exception) -> int:
    kind = classify_input_error(err)
    if kind is None:
        raise err
    code, label = kind
    print(f"{label}: {err}", file=sys.stderr)
    return code


def with_resolved_model_paths(cfg, resolve):
    actor_model = replace(cfg.actor.model, model_path=resolve(cfg.actor.model.model_path))
    rollout_model = replace(cfg.rollout.model, model_path=resolve(cfg.rollout.model.model_path))
    return replace(
        cfg,
        actor=replace(cfg.actor, model=actor_model),
        rollout=replace(cfg.rollout, model=rollout_model),
    )


def worker_failure_code(err: Exception) -> int:
    """A worker's failure exits RUN_FAILED, unless it was bad input found inside the worker (e.g. a
    checkpoint shard only the actor reads): then the code of that input's class, as on the driver."""
    kind = classify_input_error(err.__cause__) if err.__cause__ is not None else None
    return kind[0] if kind else exit_codes.RUN_FAILED


def describe_failure(err: Exception, last_good: Path | str | None) -> str:
    return f"run stopped: {err}\nlast good checkpoint: {last_good or 'none (no checkpoint was saved)'}"


def wandb_run(cfg):
    """The wandb run's settings (used when runner.logger.logger_backends includes wandb)."""
    from rlinf.config.typed import to_dict
    from rlinf.utils.wandb_sink import WandbRun

    w = cfg.runner.logger.wandb
    return WandbRun(w.project, w.name or cfg.runner.experiment_name, tuple(w.tags), to_dict(cfg))


def run(cfg) -> int:
    """Train with a validated config; returns the exit code (bad input is reported, not raised)."""
    try:
        return _run(cfg)
    except Exception as err:
        return _report_input_error(err)


def _run(cfg) -> int:
    from rlinf.data.prompt_loader import training_loader
    from rlinf.models.hf_checkpoint import ModelLoadError, load_model_config, load_tokenizer
    from rlinf.models.tiny import resolve_model_path
    from rlinf.runners.checkpointing import find_resume_point, steps_left
    from rlinf.runners.data_setup import build_datasets
    from rlinf.runners.lr_resume import config_on_resume
    from rlinf.runners.output_setup import held_output_folders

    # Built (or fetched from cache) here, so its progress bar shows in this console; the workers
    # then load the concrete directory.
    try:
        cfg = with_resolved_model_paths(cfg, resolve_model_path)
    except ValueError as err:  # an unknown tiny:// name
        raise ModelLoadError(f"actor.model.model_path: {err}") from None
    # Checks before anything is written or started: model, tokenizer, data.
    for model_path in dict.fromkeys((cfg.actor.model.model_path, cfg.rollout.model.model_path)):
        load_model_config(model_path)
    if cfg.algorithm.routing_replay.mode != "none":  # a dense model is known only from its config
        from rlinf.models.routing import check_replayable

        check_replayable(
            load_model_config(cfg.actor.model.model_path), load_model_config(cfg.rollout.model.model_path)
        )
    tokenizer = load_tokenizer(
        cfg.actor.model.model_path, trust_remote_code=cfg.actor.model.trust_remote_code
    )
    train_set, val_set, data_counters = build_datasets(cfg, tokenizer)
    # From here this run is the only writer of its folders; the resume checkpoint is read under the lock.
    with held_output_folders(cfg):
        probe = training_loader(train_set, cfg)
        point = find_resume_point(cfg, probe)
        if point is not None and steps_left(cfg, point, probe) == 0:
            print(
                f"nothing to train: {point.path} is at step {point.step}, the last step of this run "
                "(runner.max_steps / runner.max_epochs); raise runner.max_steps to train further"
            )
            return exit_codes.OK
        if point is not None:
            cfg = config_on_resume(cfg, point.lr_schedule, point.path)
        return _train(cfg, train_set, val_set, data_counters, point)


def _train(cfg, train_set, val_set, data_counters, point) -> int:
    import ray

    from rlinf.config.typed import ConfigError
    from rlinf.config.validate import total_gpus
    from rlinf.runners.checkpointing import last_good_checkpoint
    from rlinf.runners.grpo_runner import GRPORunner
    from rlinf.scheduler.cluster import cluster_address, init_ray, shutdown_ray
    from rlinf.scheduler.mps import cuda_mps_daemon
    from rlinf.scheduler.roles import launch_roles, startup_line, startup_metrics
    from rlinf.scheduler.worker_group import WorkerError
    from rlinf.utils.checkpoint import CheckpointSaveError
    from rlinf.utils.metrics import MetricLogger
    from rlinf.utils.plot import plot_training_curves

    log_path = Path(cfg.runner.logger.log_path)
    save_resolved_config(cfg, log_path)
    metrics = MetricLogger(log_path, cfg.runner.logger.logger_backends, wandb_run(cfg))
    joined_ray = not ray.is_initialized()
    runner, roles = None, None

    def last_good(failure: BaseException | None = None):
        return last_good_checkpoint(runner.checkpointer if runner else None, point, failure)

    mps = contextlib.ExitStack()
    try:
        if cfg.cluster.cuda_mps and joined_ray and cluster_address():
            raise ConfigError(
                "cluster.cuda_mps: the run starts the MPS daemon on this node for the Ray cluster it starts; "
                "with a running cluster (RAY_ADDRESS / ray_utils/ray_head_ip.txt) start one on each node instead"
            )
        mps.enter_context(cuda_mps_daemon(cfg.cluster.cuda_mps))
        started = time.perf_counter()
        init_ray(total_gpus(cfg))
        stop_on_sigterm()  # Ray's driver replaced our handler with its own stack dump
        ray_seconds = time.perf_counter() - started
        roles = launch_roles(cfg)
        startup = startup_metrics(ray_seconds, roles)
        logger.info(startup_line(startup))
        runner = GRPORunner(cfg, roles, train_set, val_set, metrics)
        if point is None:  # a resumed run's history already has them
            metrics.log(data_counters | startup, step=0)
        last = runner.run()
    except WorkerError as err:
        print(describe_failure(err, last_good(err)), file=sys.stderr)
        return worker_failure_code(err)
    except CheckpointSaveError as err:
        print(f"checkpoint error: {err}\nlast good checkpoint: {last_good() or 'none'}", file=sys.stderr)
        return exit_codes.CHECKPOINT
    except KeyboardInterrupt as err:
        stop = stopped_by(err)
        if stop is None:
            raise
        print(
            f"{stop}: the run stopped before it could save\nlast good checkpoint: {last_good() or 'none'}",
            file=sys.stderr,
        )
        return 128 + stop.signum
    finally:
        metrics.close()
        if roles is not None:
            roles.shutdown()
        if joined_ray:
            shutdown_ray()
        mps.close()  # after the workers: the daemon quits once its clients have
    if cfg.runner.logger.plot:
        plot = plot_training_curves(metrics.history(), log_path / "training_curves.png")
        print(f"plot: {plot}")
    print(
        f"TensorBoard logs: {log_path}  (tensorboard --logdir {log_path.parent})\ncheckpoint: {last or 'none (runner.save_at_end: false)'}"
    )
    return exit_codes.OK
