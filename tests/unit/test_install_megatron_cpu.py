"""requirements/install.sh megatron-cpu: its plan (--dry-run), its refusals before any work, and the
pin hash that lets CI reuse a venv only while the pins are unchanged. No real install: the venvs
here hold a stand-in `python` that only reports a version."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REQ = REPO / "requirements"
PIN = re.compile(r"^    ([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)$")
STAMP = ".rlinf-megatron-cpu-pins"


def run(*args: str, home: Path, install: Path = REQ / "install.sh") -> subprocess.CompletedProcess[str]:
    # HOME without pyenv and a PATH without python3.12: only --python or the venv give a Python.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    return subprocess.run(["bash", str(install), *args], capture_output=True, text=True, env=env, timeout=60)


def fake_python(path: Path, version: str) -> Path:
    """An executable that answers the version question the script asks (`python -c ...`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


def fake_venv(root: Path, version: str) -> Path:
    fake_python(root / "bin" / "python", version)
    return root


def plan_pins(stdout: str) -> dict[str, str]:
    return {
        m.group(1).lower().replace("_", "-"): m.group(3) for m in map(PIN.match, stdout.splitlines()) if m
    }


def file_pins(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            pins |= file_pins(path.parent / line[3:])
        elif line:
            name, version = line.split("==")
            pins[re.sub(r"\[.*\]", "", name).lower().replace("_", "-")] = version
    return pins


def pin_hash(stdout: str) -> str:
    match = re.search(r"pin hash ([0-9a-f]{64})", stdout)
    assert match, stdout
    return match.group(1)


def test_dry_run_plans_the_megatron_pins_and_creates_nothing(tmp_path: Path) -> None:
    python = fake_python(tmp_path / "py312" / "python", "3.12")
    venv = tmp_path / "venv"
    proc = run("megatron-cpu", "--venv", str(venv), "--python", str(python), "--dry-run", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not venv.exists()
    out = proc.stdout
    assert f"venv:  {venv}: create with {python}" in out
    assert "pip installs them (the venv has no pin hash)" in out
    pins = plan_pins(out)
    # Independent reference: the pin files, includes followed.
    expected = file_pins(REQ / "megatron-cpu.txt") | file_pins(REQ / "megatron-cpu-no-deps.txt")
    assert {n: pins.get(n) for n in expected} == expected
    assert pins["torch"] == file_pins(REQ / "embedded.txt")["torch"] == "2.13.0"
    assert (pins["megatron-core"], pins["pytest"]) == ("0.19.2", file_pins(REQ / "dev.txt")["pytest"])
    assert out.split("--no-deps:\n")[1].splitlines()[0] == "    megatron-bridge==0.6.2"


def test_a_venv_of_another_python_is_refused_before_any_work(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "py311", "3.11")
    before = sorted(p.name for p in venv.rglob("*"))
    proc = run("megatron-cpu", "--venv", str(venv), home=tmp_path)  # a real install, not a dry run
    assert proc.returncode == 2
    assert (
        proc.stderr
        == f"install.sh megatron-cpu: {venv} holds Python 3.11; the pins need 3.12: choose another --venv\n"
    )
    assert proc.stdout == ""  # no plan printed, no pip run
    assert sorted(p.name for p in venv.rglob("*")) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unknown option '--bogus'"),
        (["--venv"], "--venv needs a value"),
        (["--venv", "--dry-run"], "--venv needs a value"),
        (["--dry-run"], "--venv DIR is required"),
        (["--venv", "{tmp}/v", "--python"], "--python needs a value"),
        (
            ["--venv", "{tmp}/v", "--python", "{tmp}/py311/python"],
            "is Python 3.11; megatron-core 0.19's pins need 3.12",
        ),
        (["--venv", "{tmp}/v", "--python", "{tmp}/absent"], "is Python <not runnable>"),
        (["--venv", "{tmp}/not-a-venv"], "exists and is not a venv (no bin/python)"),
        (["--venv", "{tmp}/v"], "no Python 3.12 found"),
    ],
)
def test_bad_input_fails_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    fake_python(tmp_path / "py311" / "python", "3.11")
    (tmp_path / "not-a-venv").mkdir()
    (tmp_path / "not-a-venv" / "notes.txt").write_text("keep me")
    proc = run("megatron-cpu", *(a.format(tmp=tmp_path) for a in args), home=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stdout == ""
    assert not (tmp_path / "v").exists()
    assert (tmp_path / "not-a-venv" / "notes.txt").read_text() == "keep me"


def test_pins_are_skipped_only_while_the_venvs_pin_hash_matches(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "venv", "3.12")
    proc = run("megatron-cpu", "--venv", str(venv), "--dry-run", home=tmp_path)
    assert "venv:  " + str(venv) + ": reuse (Python 3.12)" in proc.stdout
    assert "pip installs them (the venv has no pin hash)" in proc.stdout
    (venv / STAMP).write_text(pin_hash(proc.stdout) + "\n")
    proc = run("megatron-cpu", "--venv", str(venv), "--dry-run", home=tmp_path)
    assert "already installed (the venv's pin hash matches): pip does not run" in proc.stdout
    (venv / STAMP).write_text("0" * 64 + "\n")
    proc = run("megatron-cpu", "--venv", str(venv), "--dry-run", home=tmp_path)
    assert "pip installs them (the venv has another pin hash)" in proc.stdout


def test_a_changed_pin_in_an_included_file_changes_the_pin_hash(tmp_path: Path) -> None:
    # A copy of the scripts and pin files, so that a pin can be changed without touching the repo.
    copy = tmp_path / "repo" / "requirements"
    copy.mkdir(parents=True)
    for name in ("install.sh", "install_megatron_cpu.sh", "python312.sh", "embedded.txt", "dev.txt"):
        shutil.copy(REQ / name, copy / name)
    for name in ("megatron-cpu.txt", "megatron-cpu-no-deps.txt"):
        shutil.copy(REQ / name, copy / name)
    venv = fake_venv(tmp_path / "venv", "3.12")

    def planned_hash() -> str:
        proc = run(
            "megatron-cpu", "--venv", str(venv), "--dry-run", home=tmp_path, install=copy / "install.sh"
        )
        assert proc.returncode == 0, proc.stderr
        return pin_hash(proc.stdout)

    original = planned_hash()
    assert original == planned_hash()  # deterministic
    embedded = copy / "embedded.txt"
    embedded.write_text(embedded.read_text().replace("torch==2.13.0", "torch==2.13.1"))
    assert planned_hash() != original


def test_install_sh_names_the_megatron_cpu_target(tmp_path: Path) -> None:
    proc = run("-h", home=tmp_path)
    assert "bash requirements/install.sh megatron-cpu --venv DIR" in proc.stdout
    proc = run("nonsense", home=tmp_path)
    assert proc.returncode == 2
    assert "(embedded, agentic or megatron-cpu)" in proc.stderr
    proc = run("megatron-cpu", "-h", home=tmp_path)
    assert proc.returncode == 0
    for option in (
        "--venv DIR",
        "--python PATH",
        "--dry-run",
        "megatron-core 0.19.2",
        "megatron-bridge 0.6.2",
    ):
        assert option in proc.stdout
