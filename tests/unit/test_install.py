"""requirements/install.sh agentic: the plan it prints (--dry-run), its refusals, its first-failure stop;
and the embedded pins that must resolve under a current pip (antlr4)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "requirements" / "install.sh"
AGENTIC = REPO / "requirements" / "agentic"
SEED_COMBO = AGENTIC / "sglang-0.5.12_torch-2.11.0_transformers-5.6.0"
# The seed's line, exactly as users type it.
SEED_LINE = (
    "agentic --sglang 0.5.12 --torch 2.11.0 --transformers 5.6.0 --no-apex --platform nvidia "
    "--use-mirror --venv /opt/venv/reason_0512_v3"
).split()
PIN = re.compile(r"^    ([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)$")


def run_install(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    env.update(env_extra or {})
    return subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True, env=env, timeout=60)


def plan_pins(stdout: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in stdout.splitlines():
        m = PIN.match(line)
        if m:
            name = m.group(1).lower().replace("_", "-")
            assert name not in pins, f"{name} appears twice in the plan"
            pins[name] = m.group(3)
    return pins


def file_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[re.sub(r"\[.*\]", "", name).lower().replace("_", "-")] = version
    return pins


@pytest.fixture(scope="module")
def seed_plan() -> subprocess.CompletedProcess[str]:
    proc = run_install(*SEED_LINE, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    return proc


def test_seed_line_plans_the_verified_versions(seed_plan: subprocess.CompletedProcess[str]) -> None:
    pins = plan_pins(seed_plan.stdout)
    expected = {
        "torch": "2.11.0",
        "transformers": "5.6.0",
        "sglang": "0.5.12",
        "sglang-kernel": "0.4.2.post2",
        "flashinfer-python": "0.6.11.post1",
        "torch-memory-saver": "0.0.10",
        "megatron-core": "0.19.2",
        "megatron-bridge": "0.6.2",
        "ray": "2.60.0",
        "hydra-core": "1.3.8",
        "omegaconf": "2.3.1",
        "antlr4-python3-runtime": "4.9.3",
        "math-verify": "0.9.0",
        "transformer-engine": "2.20.2",
        "flash-attn": "2.8.3.post2",
        "pip": "26.3",
    }
    assert {name: pins.get(name) for name in expected} == expected
    out = seed_plan.stdout
    assert "apex: skipped (--no-apex)" in out
    assert "transformer-engine: SOURCE BUILD" in out and "flash-attn: SOURCE BUILD" in out
    assert "/opt/venv/reason_0512_v3" in out
    assert "nothing is installed" in out


def test_plan_lists_every_pinned_package(seed_plan: subprocess.CompletedProcess[str]) -> None:
    # Independent reference: the combination's files themselves.
    pins = plan_pins(seed_plan.stdout)
    expected = file_pins(SEED_COMBO / "lock.txt") | file_pins(SEED_COMBO / "no-deps.txt")
    expected |= file_pins(SEED_COMBO / "pip.txt")
    assert len(expected) > 200
    missing = {n: v for n, v in expected.items() if pins.get(n) != v}
    assert not missing, f"plan lacks or changes: {sorted(missing)[:10]}"
    assert f"lock: {len(file_pins(SEED_COMBO / 'lock.txt'))} pinned packages" in seed_plan.stdout


COMBOS = sorted(p.parent for p in AGENTIC.glob("*/lock.txt"))


@pytest.mark.parametrize("combo", COMBOS, ids=lambda p: p.name)
def test_lock_satisfies_every_intent_requirement(combo: Path) -> None:
    from packaging.requirements import Requirement

    lock = file_pins(combo / "lock.txt")
    no_deps = file_pins(combo / "no-deps.txt")
    assert not set(lock) & set(no_deps), "a --no-deps package is also in the lock"
    for line in (combo / "intent.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        req = Requirement(line)
        name = req.name.lower().replace("_", "-")
        assert name in lock, f"{name} (intent.txt) is not in lock.txt"
        assert req.specifier.contains(lock[name], prereleases=True), (
            f"lock {name}=={lock[name]} breaks {line}"
        )


def test_dry_run_installs_nothing_and_needs_no_venv(tmp_path: Path) -> None:
    venv = tmp_path / "v"
    proc = run_install(*SEED_LINE[:-1], str(venv), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert not venv.exists()
    assert run_install(*SEED_LINE[:-2], "--dry-run").returncode == 0  # no --venv


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--platform", "amd"], "--platform amd is not supported: only --platform nvidia"),
        (["--bogus"], "unknown option '--bogus'"),
        (["--sglang"], "--sglang needs a value"),
        (["--venv", "--no-te"], "--venv needs a value"),
    ],
)
def test_bad_options_fail_with_a_message(args: list[str], message: str) -> None:
    proc = run_install("agentic", "--venv", "/tmp/x", *args, "--dry-run")
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(
    "versions",
    [
        ["--sglang", "0.5.23"],
        ["--sglang", "0.5.12", "--torch", "2.9.0"],
        ["--sglang", "0.5.12", "--torch", "2.11.0", "--transformers", "5.17.0"],
        ["--transformers", "5.6.0", "--torch", "2.12.0"],
    ],
)
def test_unknown_combination_lists_the_supported_ones(versions: list[str]) -> None:
    proc = run_install("agentic", *versions, "--venv", "/tmp/x", "--dry-run")
    assert proc.returncode == 2
    assert "no pinned combination for" in proc.stderr
    assert "--sglang 0.5.12 --torch 2.11.0 --transformers 5.6.0" in proc.stderr
    assert "--sglang 0.5.12 --torch 2.11.0 --transformers 5.12.1" in proc.stderr


def test_partial_versions_pick_the_only_fitting_combination() -> None:
    proc = run_install("agentic", "--transformers", "5.12.1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    pins = plan_pins(proc.stdout)
    assert (pins["sglang"], pins["torch"], pins["transformers"]) == ("0.5.12", "2.11.0", "5.12.1")
    proc = run_install("agentic", "--sglang", "0.5.12", "--dry-run")
    assert proc.returncode == 2
    assert "fits several combinations" in proc.stderr


def test_missing_venv_is_refused_for_a_real_install() -> None:
    proc = run_install("agentic", "--no-te")
    assert proc.returncode == 2
    assert "--venv PATH is required" in proc.stderr


def test_help_lists_options_and_combinations() -> None:
    proc = run_install("agentic", "-h")
    assert proc.returncode == 0
    for option in (
        "--venv",
        "--torch",
        "--sglang",
        "--transformers",
        "--platform",
        "--use-mirror",
        "--no-apex",
        "--no-te",
        "--no-flash-attn",
        "--dry-run",
        "MEGATRON_PATH",
    ):
        assert option in proc.stdout
    assert "--sglang 0.5.12 --torch 2.11.0 --transformers 5.6.0" in proc.stdout


def test_mirror_comes_from_rlinf_pip_mirror() -> None:
    mirror = "https://mirror.example/pypi/simple"
    proc = run_install(*SEED_LINE, "--dry-run", env_extra={"RLINF_PIP_MIRROR": mirror})
    assert f"index:       {mirror} (RLINF_PIP_MIRROR)" in proc.stdout
    proc = run_install(*SEED_LINE, "--dry-run", env_extra={"PIP_INDEX_URL": mirror})
    assert f"index:       {mirror} (PIP_INDEX_URL" in proc.stdout
    without = [a for a in SEED_LINE if a != "--use-mirror"]
    proc = run_install(*without, "--dry-run", env_extra={"RLINF_PIP_MIRROR": mirror})
    assert mirror not in proc.stdout


def test_megatron_path_replaces_the_pinned_wheel(tmp_path: Path) -> None:
    clone = tmp_path / "Megatron-LM"
    (clone / "megatron" / "core").mkdir(parents=True)
    (clone / "megatron" / "core" / "package_info.py").write_text("MAJOR = 0\nMINOR = 15\nPATCH = 3\n")
    proc = run_install(*SEED_LINE, "--dry-run", env_extra={"MEGATRON_PATH": str(clone)})
    assert proc.returncode == 0, proc.stderr
    assert plan_pins(proc.stdout)["megatron-core"] == "0.15.3"  # the clone's, not the lock's 0.19.2
    assert f"pip install --no-deps -e) of MEGATRON_PATH={clone}" in proc.stdout

    proc = run_install(*SEED_LINE, "--dry-run", env_extra={"MEGATRON_PATH": str(tmp_path)})
    assert proc.returncode == 2
    assert "is not a Megatron-LM clone" in proc.stderr


def test_install_stops_at_the_first_failing_step_naming_it(tmp_path: Path) -> None:
    # A venv of the wrong Python at --venv: step 'venv' fails; no pip step may run after it.
    venv = tmp_path / "py311"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    if sys.version_info[:2] == (3, 12):
        pytest.skip("needs a non-3.12 Python to build the wrong venv")
    proc = run_install(*SEED_LINE[:-1], str(venv), "--no-te", "--no-flash-attn")
    assert proc.returncode == 1
    assert "step 'venv' failed" in proc.stderr
    assert "the pins need 3.12" in proc.stderr
    assert "step 3/11 pip" not in proc.stdout.split("== install.sh agentic: step 2/11 venv")[-1]


def test_embedded_target_rejects_unknown_options() -> None:
    proc = run_install("embedded", "--gpu")
    assert proc.returncode == 2
    assert "unknown option '--gpu'" in proc.stderr
    assert run_install("nonsense").returncode == 2


def test_embedded_pins_antlr_runtime_that_hydra_accepts() -> None:
    # hydra-core/omegaconf need antlr4 4.9.*; an antlr4 extra on math-verify would ask for another
    # runtime and make pip >= 24 stop with ResolutionImpossible (issue 8).
    pins = file_pins(REPO / "requirements" / "embedded.txt")
    assert pins["antlr4-python3-runtime"] == "4.9.3"
    lines = (REPO / "requirements" / "embedded.txt").read_text().splitlines()
    assert [line for line in lines if line.startswith("math-verify")] == ["math-verify==0.9.0"]  # no extra


def test_math_verify_parses_latex_with_the_pinned_runtime() -> None:
    from importlib.metadata import version

    assert version("antlr4-python3-runtime") == "4.9.3"
    from math_verify import parse, verify

    assert verify(parse(r"$\frac12$"), parse("$0.5$"))
    assert not verify(parse(r"$\frac13$"), parse("$0.5$"))
    assert verify(parse(r"$\sqrt{2}\cdot\sqrt{8}$"), parse("$4$"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["agentic", "no-such-combination"],
            "name a combination: sglang-0.5.12_torch-2.11.0_transformers-5.12.1",
        ),
        (["agentic", "sglang-0.5.12_torch-2.11.0_transformers-5.6.0", "--bogus"], "unknown option '--bogus'"),
        ([], "usage: bash requirements/resolve.sh"),
    ],
)
def test_resolve_script_refuses_bad_arguments_before_any_work(args: list[str], message: str) -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "requirements" / "resolve.sh"), *args], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "pip" not in proc.stdout  # no venv was made, no pip ran


def test_import_check_names_every_missing_package() -> None:
    # This Python has torch and ray but not the GPU stack: the check must fail and say which.
    import importlib.util

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here")
    proc = subprocess.run(
        [sys.executable, str(AGENTIC / "check_stack.py")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "FAIL  sglang: ModuleNotFoundError" in proc.stdout
    assert "ok    torch " in proc.stdout and "ok    ray " in proc.stdout
    assert "import check failed for: sglang" in proc.stderr
