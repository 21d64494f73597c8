"""tests/megatron_cpu/conftest.py under RLINF_REQUIRE_MEGATRON=1 (what CI sets for its Python 3.12
run): a module that skips itself at import (megatron missing) and a test that skips at run time
both fail, naming the skip's reason; without the variable they skip, as on the embedded stack."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

MISSING_AT_IMPORT = """
import pytest
pytest.importorskip("megatron_absent_for_this_test", reason="needs megatron-core 0.19")

def test_never_collected():
    pass
"""
SKIPS_AT_RUN_TIME = """
import pytest

def test_passes():
    pass

def test_skips():
    pytest.skip("megatron-core found TE here")

@pytest.mark.xfail(reason="known gap", strict=True)
def test_expected_failure():
    raise AssertionError
"""


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of tests/megatron_cpu's conftest beside two small test modules."""
    root = tmp_path_factory.mktemp("suite") / "megatron_cpu"
    root.mkdir()
    shutil.copy(REPO / "tests" / "megatron_cpu" / "conftest.py", root / "conftest.py")
    (root / "test_missing_at_import.py").write_text(MISSING_AT_IMPORT)
    (root / "test_skips_at_run_time.py").write_text(SKIPS_AT_RUN_TIME)
    return root


def run_suite(
    suite: Path, require: str | None, module: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RLINF_REQUIRE_MEGATRON"}
    if require is not None:
        env["RLINF_REQUIRE_MEGATRON"] = require
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(suite),
            str(suite / (module or "")),
        ],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_required_megatron_fails_a_module_that_skips_at_import(suite: Path) -> None:
    proc = run_suite(suite, "1", "test_missing_at_import.py")
    assert proc.returncode not in (0, 5), proc.stdout
    assert (
        "RLINF_REQUIRE_MEGATRON=1 forbids skips: test_missing_at_import.py skipped (needs megatron-core 0.19)"
        in proc.stdout
    )
    assert "skipped" not in proc.stdout.splitlines()[-1]


def test_required_megatron_fails_a_test_that_skips_at_run_time(suite: Path) -> None:
    proc = run_suite(suite, "1", "test_skips_at_run_time.py")
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 1 passed, 1 xfailed" in proc.stdout  # the xfail stays an xfail
    assert (
        "forbids skips: test_skips_at_run_time.py::test_skips skipped (megatron-core found TE here)"
        in proc.stdout
    )


@pytest.mark.parametrize("require", [None, "0"])
def test_without_the_variable_skips_stay_skips(suite: Path, require: str | None) -> None:
    proc = run_suite(suite, require)
    assert proc.returncode == 0, proc.stdout
    assert "1 passed, 2 skipped, 1 xfailed" in proc.stdout
