"""Bad input ends cleanly: main_grpo.py as a new user runs it, with a recipe, data, model or checkpoint
that cannot work. Each gives one line naming the file and the problem, its own exit code
(rlinf.config.exit_codes), no traceback, nothing written, and no Ray started."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf.config import exit_codes
from tests.integration.conftest import copy_saved_run, small_run_overrides

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
BOBA = REPO / "tests" / "fixtures" / "gsm8k_like_boba.jsonl"  # 12 GSM8K-style problems, 318-432 chars
BOBA_DATA = ["data.type=math", f"data.train_data_paths=[{BOBA}]", f"data.val_data_paths=[{BOBA}]"]


def main_grpo(cwd: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "examples/reasoning/main_grpo.py"), "tiny-moe-grpo-cpu", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )


def assert_refused(proc: subprocess.CompletedProcess, code: int, label: str, *fragments: str) -> str:
    """Exit `code`, exactly one `label:` line holding every fragment, no traceback, Ray never started."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == code, output
    assert "Traceback" not in output, output
    assert "Started a local Ray instance" not in output, output
    lines = [line for line in proc.stderr.splitlines() if line.startswith(f"{label}:")]
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_a_new_users_boba_file_with_too_long_prompts_gives_one_line(tmp_path):
    proc = main_grpo(tmp_path, *BOBA_DATA)  # the tiny recipe's max_prompt_length: 64
    line = assert_refused(
        proc,
        exit_codes.DATA,
        "data error",
        f"data.train_data_paths ({BOBA})",
        "all 12 prompts are longer than data.max_prompt_length=64 tokens",
        "raise data.max_prompt_length",
    )
    assert "the shortest has" in line
    # The character tokenizer of the tiny model cannot read most prose: said once per split, with examples.
    assert "are text the tokenizer does not know and became <|unk|> (e.g. 'A'" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no logs, no results, no resolved config


def test_a_new_users_boba_file_runs_with_enough_prompt_length(tmp_path):
    proc = main_grpo(
        tmp_path,
        *BOBA_DATA,
        "data.max_prompt_length=512",
        "actor.seq_length=576",
        "runner.max_steps=2",
        "data.rollout_batch_size=4",
        "algorithm.group_size=4",
        "actor.global_batch_size=16",
        "actor.micro_batch_size=8",
        timeout=480,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == exit_codes.OK, output
    assert "step 2/2" in proc.stdout and "Traceback" not in output
    rows = [
        json.loads(line)
        for line in (tmp_path / "logs" / "tiny-moe-grpo-cpu" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows if r["step"] > 0] == [1, 2]
    assert {r.get("data/train_prompts") for r in rows if r["step"] == 0} >= {12.0}
    assert (tmp_path / "results" / "tiny-moe-grpo-cpu" / "checkpoints" / "step_2" / "COMPLETE").is_file()


@pytest.mark.parametrize(
    ("overrides", "code", "label", "fragment"),
    [
        (
            [
                "data.type=math",
                "data.train_data_paths=[missing.jsonl]",
                "data.val_data_paths=[missing.jsonl]",
            ],
            exit_codes.DATA,
            "data error",
            "data file not found: missing.jsonl",
        ),
        (
            ["actor.model.model_path=/no/such/model"],
            exit_codes.MODEL,
            "model error",
            "model directory /no/such/model does not exist",
        ),
        (
            ["actor.model.model_path=tiny://nope"],
            exit_codes.MODEL,
            "model error",
            "unknown tiny model 'tiny://nope'",
        ),
        (
            ["data.synthetic.num_train=8"],
            exit_codes.DATA,
            "data error",
            "data.synthetic (train): 8 usable training prompt(s), fewer than data.rollout_batch_size=16",
        ),
        (
            ["algorithm.grup_size=3"],
            exit_codes.CONFIG,
            "config error",
            "command line (algorithm.grup_size=3): unknown key 'algorithm.grup_size'",
        ),
        (
            ["actor.optim.lr=nan"],
            exit_codes.CONFIG,
            "config error",
            "actor.optim.lr: nan is not a finite number",
        ),
        (
            ["data.train_data_paths=[my.jsonl]"],
            exit_codes.CONFIG,
            "config error",
            "data.train_data_paths: set to ('my.jsonl',), but this recipe ignores it (actor.training_backend=torch, "
            "rollout.rollout_backend=torch, data.type=synthetic, 0 GPU(s)); it is honoured only by: data.type=math. "
            "Remove the key, or choose data.type=math",
        ),
        (
            ["rollout.gpu_memory_utilization=0.9"],
            exit_codes.CONFIG,
            "config error",
            "honoured only by: rollout.rollout_backend=sglang",
        ),
    ],
    ids=[
        "missing-data-file",
        "missing-model",
        "unknown-tiny-model",
        "too-few-prompts",
        "unknown-key",
        "nan-lr",
        "data-file-for-synthetic",
        "ignored-key",
    ],
)
def test_bad_recipe_data_or_model(tmp_path, overrides, code, label, fragment):
    assert_refused(main_grpo(tmp_path, *overrides), code, label, fragment)
    assert list(tmp_path.iterdir()) == []


def test_routing_replay_of_a_dense_model_is_refused(random_tiny_checkpoint, tmp_path):
    """Whether a model has routed experts is known from its config.json: read before Ray starts."""
    dense = tmp_path / "dense"
    shutil.copytree(random_tiny_checkpoint, dense)
    config = json.loads((dense / "config.json").read_text())
    config["first_k_dense_replace"] = config["num_hidden_layers"]
    (dense / "config.json").write_text(json.dumps(config))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = main_grpo(run_dir, f"actor.model.model_path={dense}", "algorithm.routing_replay.mode=replay")
    assert_refused(
        proc,
        exit_codes.CONFIG,
        "config error",
        "algorithm.routing_replay.mode: the model is dense",
        "set mode: none",
    )
    assert list(run_dir.iterdir()) == []


def _latin1_line(tmp_path: Path) -> tuple[Path, str]:
    data = tmp_path / "data" / "prompts.jsonl"
    data.parent.mkdir()
    good = b'{"prompt": "1+2=", "solutions": ["3"]}\n'
    data.write_bytes(good + '{"prompt": "caf\xe9 1+1=", "solutions": ["2"]}\n'.encode("latin-1") + good)
    return data, f"{data}:2: not UTF-8 text: byte 0xe9 at column 16"


def _directory(tmp_path: Path) -> tuple[Path, str]:
    data = tmp_path / "data"
    data.mkdir()
    return data, f"{data}: is a directory, not a data file"


@pytest.mark.parametrize("make", [_latin1_line, _directory], ids=["not-utf8", "directory"])
def test_a_bad_data_file_gives_one_line(tmp_path, make):
    data, fragment = make(tmp_path)
    files = ["data.type=math", f"data.train_data_paths=[{data}]", f"data.val_data_paths=[{data}]"]
    assert_refused(main_grpo(tmp_path, *files), exit_codes.DATA, "data error", fragment)
    assert [p.name for p in tmp_path.iterdir()] == ["data"]  # nothing written


def _truncate_weights(checkpoint: Path) -> Path:
    weights = checkpoint / "actor" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    return weights


def _drop_complete_marker(checkpoint: Path) -> Path:
    (checkpoint / "COMPLETE").unlink()
    return checkpoint


def _other_data_size(checkpoint: Path) -> Path:
    state_file = checkpoint / "runner_state.json"
    state = json.loads(state_file.read_text())
    state["data"]["size"] = 999
    state_file.write_text(json.dumps(state))
    return state_file


@pytest.mark.parametrize(
    ("spoil", "extra", "fragment"),
    [
        (_truncate_weights, {}, "corrupt weight file: truncated"),
        (
            _drop_complete_marker,
            {"runner.resume_dir": "{checkpoint}"},
            "incomplete checkpoint (no COMPLETE marker",
        ),
        (_other_data_size, {}, "999 items in the dataset but it now has 64"),
        (
            lambda c: c / "resolved_config.yaml",
            {"algorithm.group_size": 2, "actor.global_batch_size": 8},
            "incompatible checkpoint: algorithm.group_size was 4, this run has 2",
        ),
        (
            lambda c: c.parent / "step_7",
            {"runner.resume_dir": "{root}/step_7"},
            "checkpoint directory does not exist",
        ),
    ],
    ids=["truncated-weights", "incomplete", "data-changed", "incompatible", "missing"],
)
def test_bad_checkpoint_on_resume(saved_run, random_tiny_checkpoint, tmp_path, spoil, extra, fragment):
    checkpoint = copy_saved_run(saved_run, tmp_path)
    named = spoil(checkpoint)
    extra = {k: str(v).format(checkpoint=checkpoint, root=checkpoint.parent) for k, v in extra.items()}
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    history = (tmp_path / "logs" / "metrics.jsonl").read_text()
    overrides = small_run_overrides(
        random_tiny_checkpoint, tmp_path, **{"runner.max_steps": 3, "runner.resume_dir": "auto", **extra}
    )
    line = assert_refused(
        main_grpo(tmp_path, *overrides), exit_codes.CHECKPOINT, "checkpoint error", fragment
    )
    assert str(named) in line
    # nothing half-written: the same files, the metrics history untouched
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "logs" / "metrics.jsonl").read_text() == history


def test_a_resume_that_fails_in_the_worker_names_the_checkpoint_before_it(
    saved_run, random_tiny_checkpoint, tmp_path
):
    """The actor's optimizer state is read only by the worker: its failure names the last good
    checkpoint, the complete one before the checkpoint that could not be loaded."""
    checkpoint = copy_saved_run(saved_run, tmp_path)
    state = checkpoint / "actor" / "actor_state.pt"
    state.write_bytes(b"not a torch file")
    root = checkpoint.parent
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    history = (tmp_path / "logs" / "metrics.jsonl").read_text()
    # A third step changes the schedule's decay length (runner.max_steps): follow the new one.
    overrides = small_run_overrides(
        random_tiny_checkpoint,
        tmp_path,
        **{"runner.max_steps": 3, "runner.resume_dir": "auto", "actor.lr_sched.on_resume": "override"},
    )
    proc = main_grpo(tmp_path, *overrides)
    output = proc.stdout + proc.stderr
    assert proc.returncode == exit_codes.CHECKPOINT, output
    assert "Traceback" not in output
    stopped = [line for line in proc.stderr.splitlines() if line.startswith("run stopped:")]
    assert len(stopped) == 1 and f"{state}: corrupt or incompatible actor state" in stopped[0], proc.stderr
    assert (
        f"last good checkpoint: {root / 'step_1'} (the resume checkpoint {checkpoint} could not be loaded)"
        in proc.stderr.splitlines()
    ), proc.stderr
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before  # nothing lost
    assert (tmp_path / "logs" / "metrics.jsonl").read_text() == history


def test_extending_a_run_whose_lr_decay_follows_max_steps_stops_with_the_ways_on(
    saved_run, random_tiny_checkpoint, tmp_path
):
    """The tiny recipe's cosine decays over runner.max_steps: the 2-step run recorded 4 optimizer
    steps, a 4-step run plans 8. Without actor.lr_sched.on_resume the resume is refused."""
    checkpoint = copy_saved_run(saved_run, tmp_path)
    before = {p: p.is_file() and p.read_bytes() for p in tmp_path.rglob("*")}
    overrides = small_run_overrides(
        random_tiny_checkpoint, tmp_path, **{"runner.max_steps": 4, "runner.resume_dir": "auto"}
    )
    line = assert_refused(
        main_grpo(tmp_path, *overrides),
        exit_codes.CONFIG,
        "config error",
        f"this run's LR schedule differs from the one {checkpoint} recorded",
        "decay_steps: 4 in the checkpoint, 8 in this run (actor.lr_sched.lr_decay_steps; null: runner.max_steps",
        "actor.lr_sched.on_resume=use_checkpoint to keep the checkpoint's schedule",
        "actor.lr_sched.on_resume=override to follow this run's from optimizer step 4 on",
    )
    assert line.count("in the checkpoint") == 1  # the one value that differs
    assert {p: p.is_file() and p.read_bytes() for p in tmp_path.rglob("*")} == before  # nothing written
