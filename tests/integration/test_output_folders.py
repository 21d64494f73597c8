"""Runs that lose nothing: one writer per output folder, write problems found before training, a save
that fails on a full disk. Each case runs main_grpo.py as a user would and checks the exit code, the
one line naming the problem, that no traceback is printed, and what is left on disk.

Root ignores permission bits, so the write failures here are real ones root cannot bypass: a small
tmpfs mounted for the test (its size is a hard limit: ENOSPC), the same tmpfs remounted read-only
(EROFS), a file where a folder must be, and `chattr +i` (EPERM even for root). A test whose
mechanism this machine does not allow (no CAP_SYS_ADMIN for mount, a filesystem without chattr)
is skipped, saying so.
"""

import json
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import yaml

from rlinf.config import exit_codes
from rlinf.utils.metrics import HISTORY_FILE
from rlinf.utils.run_lock import LOCK_FILE
from tests.integration.conftest import small_config, small_run_overrides

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _command(checkpoint: Path, out: Path, **extra) -> list[str]:
    overrides = small_run_overrides(
        checkpoint,
        out,
        **{"runner.val_check_interval": 0, "runner.save_interval": 1, "runner.logger.plot": "false", **extra},
    )
    return [sys.executable, str(REPO / "examples/reasoning/main_grpo.py"), "tiny-moe-grpo-cpu", *overrides]


class Run:
    """A run in the background, its output in files (a pipe nobody reads could fill and block it)."""

    def __init__(self, command: list[str], cwd: Path, name: str) -> None:
        self.out, self.err = cwd.parent / f"{name}.out", cwd.parent / f"{name}.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(command, stdout=out, stderr=err, cwd=cwd)
        self.pid = self.proc.pid

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        code = self.proc.wait(timeout=timeout)
        return code, self.out.read_text(), self.err.read_text()


def _one_line(stderr: str, label: str, *fragments: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith(f"{label}:")]
    assert len(lines) == 1, stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _wait_for(condition, run: Run, what: str, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert run.proc.poll() is None, f"the run ended before {what}: {run.err.read_text()}"
        assert time.time() < deadline, f"no {what} after {timeout}s"
        time.sleep(0.2)


def _holds_lock(folder: Path, pid: int) -> bool:
    try:
        return f'"pid": {pid},' in (folder / LOCK_FILE).read_text()
    except FileNotFoundError:
        return False


def test_one_writer_per_output_folder(random_tiny_checkpoint, tmp_path):
    """A second run on a busy folder is refused at once; the first keeps only its own files; the
    lock of a SIGKILLed run is taken over, and a resume past max_steps is refused, losing nothing."""
    tmp_path = tmp_path / "run"
    tmp_path.mkdir()
    root = tmp_path / "results" / "it" / "checkpoints"
    logs = tmp_path / "logs"
    first = Run(_command(random_tiny_checkpoint, tmp_path, **{"runner.seed": 1}), tmp_path, "first")
    _wait_for(lambda: _holds_lock(root, first.pid) and _holds_lock(logs, first.pid), first, "lock")

    started = time.time()
    second = subprocess.run(
        _command(random_tiny_checkpoint, tmp_path, **{"runner.seed": 2}),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    refused_after = time.time() - started
    assert second.returncode == exit_codes.CONFIG, second.stderr
    _one_line(
        second.stderr,
        "config error",
        f"runner.output_dir: {root} is in use by another run",
        f"(PID {first.pid} on host {socket.gethostname()}, started ",
    )
    assert "Traceback" not in second.stdout + second.stderr
    assert "Started a local Ray instance" not in second.stderr
    assert refused_after < 60, f"the second run took {refused_after:.0f}s to be refused"

    code, out, err = first.finish()
    assert code == exit_codes.OK, out + err
    assert "Traceback" not in out + err
    # only the first run's files: its checkpoints (keep 2), one metric row per step, its config
    assert [p.name for p in sorted(root.iterdir())] == ["step_2", "step_3"]
    for checkpoint in root.iterdir():
        assert yaml.safe_load((checkpoint / "resolved_config.yaml").read_text())["runner"]["seed"] == 1
    rows = [json.loads(line) for line in (logs / HISTORY_FILE).read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    assert yaml.safe_load((logs / "resolved_config.yaml").read_text())["runner"]["seed"] == 1
    assert not (root / LOCK_FILE).exists() and not (logs / LOCK_FILE).exists()  # released

    # A run killed outright (SIGKILL) cannot release its lock ...
    before = {path: _listing(path) for path in (root, logs)}
    history = (logs / HISTORY_FILE).read_text()
    # the cosine decays over runner.max_steps: resuming with more steps keeps the recorded schedule
    resume = {"runner.seed": 1, "runner.resume_dir": "auto", "actor.lr_sched.on_resume": "use_checkpoint"}
    killed = Run(
        _command(random_tiny_checkpoint, tmp_path, **{**resume, "runner.max_steps": 5}), tmp_path, "killed"
    )
    _wait_for(lambda: _holds_lock(root, killed.pid), killed, "lock")
    killed.proc.kill()
    killed.finish()
    # ... the next run takes it over with a warning; it asks to resume past its max_steps: refused.
    third = subprocess.run(
        _command(random_tiny_checkpoint, tmp_path, **{**resume, "runner.max_steps": 2}),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert third.returncode == exit_codes.CONFIG, third.stderr
    assert (
        f"taking over the lock of a run that is gone without releasing it (PID {killed.pid} on host"
        in third.stderr
    )
    _one_line(
        third.stderr,
        "config error",
        f"runner.max_steps=2, but the checkpoint to resume, {root / 'step_3'}, is already at step 3",
        "Raise runner.max_steps above 3",
    )
    assert "Traceback" not in third.stdout + third.stderr
    assert {path: _listing(path) for path in (root, logs)} == before  # nothing lost, nothing left
    assert (logs / HISTORY_FILE).read_text() == history


@contextmanager
def _small_filesystem(path: Path, size_bytes: int):
    """A tmpfs of `size_bytes` mounted for the test (needs CAP_SYS_ADMIN, as root has here)."""
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): needs root with CAP_SYS_ADMIN")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_save_on_a_full_disk_names_space_and_path_and_keeps_the_last_good(random_tiny_checkpoint, tmp_path):
    """The checkpoints go to a tmpfs that holds one checkpoint and a half: step 1 is saved, step 2's
    save hits ENOSPC (torch.save reports it without the OS error)."""
    from rlinf.runners.output_setup import expected_checkpoint_bytes

    cfg = small_config(random_tiny_checkpoint, tmp_path)
    size, _ = expected_checkpoint_bytes(cfg, tmp_path / "none")
    with _small_filesystem(tmp_path / "disk", size * 3 // 2) as disk:
        root = disk / "it" / "checkpoints"
        stale = root / ".tmp_step_9"  # left by a crashed run: removed before training
        stale.mkdir(parents=True)
        (stale / "actor_state.pt").write_bytes(b"x" * 1000)
        proc = subprocess.run(
            _command(random_tiny_checkpoint, tmp_path, **{"runner.output_dir": disk}),
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=300,
        )
        assert proc.returncode == exit_codes.CHECKPOINT, proc.stderr
        assert f"removed {stale}, a partial save an earlier run left" in proc.stderr
        _one_line(
            proc.stderr,
            "checkpoint error",
            f"saving step 2 to {root / 'step_2'} failed: [Errno 28] No space left on device",
            "its partial folder was removed",
        )
        _one_line(proc.stderr, "last good checkpoint", str(root / "step_1"))
        assert "Traceback" not in proc.stdout + proc.stderr
        assert _listing(root)[:1] == ["step_1"] and not [p for p in _listing(root) if "tmp" in p]
        assert (root / "step_1" / "COMPLETE").is_file()
        rows = [json.loads(line) for line in (tmp_path / "logs" / HISTORY_FILE).read_text().splitlines()]
        assert [row["step"] for row in rows] == [0, 1, 2]  # step 2 trained and logged before its save


def _read_only_filesystem(run_dir: Path, cleanup: ExitStack) -> tuple[dict, str]:
    disk = cleanup.enter_context(_small_filesystem(run_dir / "disk", 2**20))
    (disk / "it" / "checkpoints").mkdir(parents=True)  # an earlier run's folder, now read-only
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    return {
        "runner.output_dir": disk
    }, f"{disk}/it/checkpoints cannot be written: [Errno 30] Read-only file system"


def _file_as_output_dir(run_dir: Path, cleanup: ExitStack) -> tuple[dict, str]:
    (run_dir / "results").write_text("not a folder")
    return {}, f"{run_dir}/results/it/checkpoints cannot be created: [Errno 20] Not a directory"


def _partial_save_that_cannot_be_removed(run_dir: Path, cleanup: ExitStack) -> tuple[dict, str]:
    partial = run_dir / "results" / "it" / "checkpoints" / ".tmp_step_2"
    partial.mkdir(parents=True)
    (partial / "actor_state.pt").write_bytes(b"x")
    made = subprocess.run(["chattr", "+i", str(partial)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i does not work on {run_dir} ({made.stderr.strip()})")
    cleanup.callback(subprocess.run, ["chattr", "-i", str(partial)], check=False)
    return (
        {},
        f"{partial}, a partial save an earlier run left, cannot be removed: [Errno 1] Operation not permitted",
    )


@pytest.mark.parametrize(
    "setup",
    [_read_only_filesystem, _file_as_output_dir, _partial_save_that_cannot_be_removed],
    ids=["read-only-filesystem", "file-as-output-dir", "partial-save-immutable"],
)
def test_an_output_folder_that_cannot_be_written_is_refused_before_training(
    random_tiny_checkpoint, tmp_path, setup
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with ExitStack() as cleanup:
        extra, fragment = setup(run_dir, cleanup)
        before = _listing(run_dir)
        proc = subprocess.run(
            _command(random_tiny_checkpoint, run_dir, **extra),
            capture_output=True,
            text=True,
            cwd=run_dir,
            timeout=120,
        )
        assert proc.returncode == exit_codes.CONFIG, proc.stderr
        _one_line(proc.stderr, "config error", "runner.output_dir: ", fragment)
        assert "Traceback" not in proc.stdout + proc.stderr
        assert "Started a local Ray instance" not in proc.stderr  # found before training
        assert _listing(run_dir) == before  # the log folder it created is gone again


def test_sigterm_during_start_up_unwinds_with_a_message(random_tiny_checkpoint, tmp_path):
    """SIGTERM after Ray started (Ray's driver installs its own handler) but before step 1."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = Run(_command(random_tiny_checkpoint, run_dir, **{"runner.max_steps": 50}), run_dir, "sigterm")
    _wait_for(lambda: "Started a local Ray instance" in run.err.read_text(), run, "Ray start")
    time.sleep(1)
    run.proc.send_signal(signal.SIGTERM)
    code, out, err = run.finish(timeout=120)
    assert code == 128 + signal.SIGTERM, err
    _one_line(err, "stopped by SIGTERM", "the run stopped before it could save")
    _one_line(err, "last good checkpoint", "none")
    assert "*** SIGTERM received" not in err and "Traceback" not in out + err
    assert not list(run_dir.rglob(LOCK_FILE))  # released on the way out
    assert not list(run_dir.rglob("step_*"))
