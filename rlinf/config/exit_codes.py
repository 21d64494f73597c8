"""Exit codes of main_grpo.py, one per class of failure (documented in docs/configuration.md), so a
script can tell a bad recipe from bad data from a broken checkpoint without parsing messages."""

from __future__ import annotations

# Imports nothing: the configuration reference renders TABLE.
OK = 0
RUN_FAILED = 1  # a worker failed or died during the run; the message names the last good checkpoint
# (bad input a worker finds itself, e.g. a corrupt shard only the actor reads, exits with its own code)
CONFIG = 2  # the recipe or an override: unknown key, wrong type, a cross-field rule, an ignored key
BACKEND = 3  # the recipe's backend is not installed (or not shipped) on this machine
DATA = 4  # a data file, a record, or prompts that cannot form a batch (e.g. all too long)
CHECKPOINT = 5  # runner.resume_dir: missing, incomplete, corrupt or from an incompatible run
MODEL = 6  # actor.model.model_path / rollout.model.model_path is not a usable checkpoint

TABLE = (  # (code, name, meaning)
    (OK, "ok", "the run finished (or stopped on SIGINT/SIGTERM after saving a checkpoint)"),
    (
        RUN_FAILED,
        "run failed",
        "a worker failed or died during the run; stderr names it and the last good checkpoint",
    ),
    (
        CONFIG,
        "config",
        "recipe error: unknown key, wrong type, a broken cross-field rule, or a key the backend ignores",
    ),
    (BACKEND, "backend", "the recipe's backend is not installed here; stderr gives the install command"),
    (
        DATA,
        "data",
        "data error: a data file or record, or prompts that cannot form a batch (e.g. all too long)",
    ),
    (
        CHECKPOINT,
        "checkpoint",
        "checkpoint error: runner.resume_dir is missing, incomplete, corrupt or incompatible",
    ),
    (
        MODEL,
        "model",
        "model error: the model path is not a usable HF checkpoint (config, weights, tokenizer)",
    ),
)
