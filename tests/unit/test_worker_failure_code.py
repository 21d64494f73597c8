"""rlinf.runners.main.worker_failure_code: bad input found inside a worker (its error is the
WorkerError's cause, as rlinf.scheduler.worker_group raises it) exits with that input's code."""

import pytest

from rlinf.config import exit_codes
from rlinf.config.megatron_settings import MegatronSettingsError
from rlinf.config.typed import ConfigError
from rlinf.data.records import DatasetError
from rlinf.runners.main import worker_failure_code
from rlinf.scheduler.worker_group import WorkerDiedError, WorkerError
from rlinf.utils.checkpoint import CheckpointError


def raised_from(cause: BaseException | None) -> WorkerError:
    try:
        raise WorkerError(f"actor worker (rank 0) failed: {cause}") from cause
    except WorkerError as err:
        return err


@pytest.mark.parametrize(
    ("cause", "code"),
    [
        (CheckpointError("step_4/actor/optimizer.pt: corrupt"), exit_codes.CHECKPOINT),
        (DatasetError("train.jsonl:3: not JSON"), exit_codes.DATA),
        (ConfigError("actor.x: unknown key"), exit_codes.CONFIG),
        # what the actor's workers decide with Transformer Engine known (rlinf.config.megatron_settings)
        (
            MegatronSettingsError("actor.optim.exp_avg_sq_dtype: bf16 with adam_beta2 0.999"),
            exit_codes.CONFIG,
        ),
        (RuntimeError("CUDA error"), exit_codes.RUN_FAILED),
        (None, exit_codes.RUN_FAILED),
    ],
)
def test_code_follows_the_workers_own_error(cause, code):
    assert worker_failure_code(raised_from(cause)) == code


def test_a_dead_worker_is_a_failed_run():
    assert worker_failure_code(WorkerDiedError("rollout worker (rank 0) died")) == exit_codes.RUN_FAILED
