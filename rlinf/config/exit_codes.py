"""Exit codes of main_grpo.py, one per class of failure (documented in docs/configuration.md), so a
script can tell a bad recipe from bad data from a broken checkpoint without parsing messages."""

from __future__ import annotations

# Imports nothing: the configuration reference renders TABLE.
OK = 0
RUN_FAILED = 1  # a worker failed or died during the run; the message names the last good checkpoint
# (bad input a worker finds itself, e.g. a corrupt shard only the actor reads, exits with its own code)
CONFIG = 2  # the recipe or an override: unknown key, wrong type, a cross-field rule, an ignored key;
# also an output folder another run holds or that cannot be written, a resume past runner.max_steps, and
# a resume whose LR schedule differs from the checkpoint's (actor.lr_sched.on_resume)
BACKEND = 3  # the recipe's backend is not installed (or not shipped) on this machine
DATA = 4  # a data file, a record, or prompts that cannot form a batch (e.g. all too long)
CHECKPOINT = 5  # runner.resume_dir: missing, incomplete, corrupt or from an incompatible run; a failed save
MODEL = 6  # actor.model.model_path / rollout.model.model_path is not a usable checkpoint
INTERRUPTED = 130  # 128 + SIGINT: a second Ctrl-C, or Ctrl-C outside the training loop
TERMINATED = 143  # 128 + SIGTERM outside the training loop (start-up, the final save, shutdown)

TABLE = (  # (code, name, meaning)
    (
        OK,
        "ok",
        "the run finished (or stopped on SIGINT/SIGTERM after saving a checkpoint; or its resume "
        "checkpoint was already at the last step: nothing to train)",
    ),
    (
        RUN_FAILED,
        "run failed",
        "a worker failed or died during the run; stderr names it and the last good checkpoint",
    ),
    (
        CONFIG,
        "config",
        "recipe error: unknown key, wrong type, a number out of its range (NaN, inf), a broken cross-field "
        "rule, a key the chosen backend or data type ignores, a resume past runner.max_steps or with an LR "
        "schedule other than the checkpoint's (without actor.lr_sched.on_resume); or an output "
        "folder (checkpoints, logs) that another run holds (stderr names its PID and host) or that cannot be "
        "written (stderr names the folder and the OS error), found before Ray starts",
    ),
    (BACKEND, "backend", "the recipe's backend is not installed here; stderr gives the install command"),
    (
        DATA,
        "data",
        "data error: a data file (missing, a directory, unreadable) or a record (stderr names file:line; a "
        "line that is not UTF-8 is a bad record, skipped under data.skip_invalid), or prompts that cannot "
        "form a batch (e.g. all too long)",
    ),
    (
        CHECKPOINT,
        "checkpoint",
        "checkpoint error: runner.resume_dir is missing, incomplete, corrupt or incompatible (another "
        "parallel layout included); or a save failed (no space, read-only): stderr names the path, the OS "
        "error and the last good checkpoint, and the partial save is removed",
    ),
    (
        MODEL,
        "model",
        "model error: the model path is not a usable HF checkpoint (config, weights, tokenizer)",
    ),
    (
        INTERRUPTED,
        "interrupted",
        "Ctrl-C outside the training loop, or a second Ctrl-C (in the loop the first one finishes the step "
        "and saves: exit 0)",
    ),
    (
        TERMINATED,
        "terminated",
        "SIGTERM outside the training loop (start-up, the final save): the run unwinds and names the last "
        "good checkpoint",
    ),
)
