"""Shared fixtures of the end-to-end tests: where the kiln binary is, how to run it, the model cache.

The tests drive kiln only through its command line, as a user would. CTest passes the binary in
KILN_BIN; run by hand, the newest build*/kiln under the repository root is used.
"""
from __future__ import annotations

import glob
import os
import subprocess
from dataclasses import dataclass
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))

from e2e_models import E2eModel, load_model_list  # noqa: E402,F401  (shared with tests/gpu)


def pytest_addoption(parser):
    parser.addoption("--kiln-model", action="append", default=[],
                     help="only run the model tests of this model (may be repeated)")


def pytest_collection_modifyitems(config, items):
    wanted = config.getoption("--kiln-model")
    if not wanted:
        return
    unknown = set(wanted) - {m.name for m in load_model_list()}
    if unknown:
        raise pytest.UsageError(f"--kiln-model: not in tests/e2e/models.txt: {sorted(unknown)}")
    keep, drop = [], []
    for item in items:
        model = getattr(item, "callspec", None) and item.callspec.params.get("model")
        (keep if model is not None and model.name in wanted else drop).append(item)
    items[:] = keep
    config.hook.pytest_deselected(items=drop)


def find_kiln() -> str:
    env = os.environ.get("KILN_BIN")
    if env:
        return env
    candidates = [p for p in glob.glob(os.path.join(REPO, "build*", "kiln")) if os.access(p, os.X_OK)]
    if not candidates:
        pytest.exit("kiln binary not found: build it (bash scripts/setup.sh) or set KILN_BIN", returncode=2)
    return max(candidates, key=os.path.getmtime)


@pytest.fixture(scope="session")
def kiln_bin() -> str:
    return find_kiln()


@dataclass
class KilnResult:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (f"$ {' '.join(self.args)}\nexit code {self.returncode}\n"
                f"--- stderr ---\n{self.stderr[-3000:]}\n--- stdout (tail) ---\n{self.stdout[-1500:]}")


@pytest.fixture(scope="session")
def run_kiln(kiln_bin):
    """Runs `kiln ARGS...` and returns what it printed; never raises on a non-zero exit."""

    def run(*args: str, timeout: float = 600) -> KilnResult:
        cmd = [kiln_bin, *map(str, args)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return KilnResult(cmd, p.returncode, p.stdout, p.stderr)

    return run


@pytest.fixture
def check_against_onnxruntime(run_kiln, tmp_path):
    """`kiln check MODEL` with the given inputs (saved as .npy under tmp_path), no bisection:
    kiln's CPU engine, with its passes, against ONNX Runtime; asserts PASSED and returns the result."""

    def check(path, feed: dict) -> KilnResult:
        args = []
        for name, value in feed.items():
            np.save(tmp_path / f"{name}.npy", value)
            args += ["--inputs", f"{name}={tmp_path / f'{name}.npy'}"]
        r = run_kiln("check", path, *args, "--no-bisect")
        assert r.returncode == 0 and "PASSED" in r.stdout, r.describe()
        return r

    return check


@pytest.fixture(scope="session")
def model_cache() -> str:
    """Exported models are cached by torch version: exporting is the slow part of these tests,
    and a new torch may export differently, so its models get a fresh directory."""
    from importlib.metadata import version  # not `import torch`: that takes seconds

    path = os.path.join(REPO, "tests", "e2e", ".models", f"torch-{version('torch')}")
    os.makedirs(path, exist_ok=True)
    return path


# --- a closing table of the model tests: one line each, with the first line of its failure ---

_model_results: list[tuple[str, str, str]] = []


def _first_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    return text.strip().splitlines()[0] if text.strip() else ""


def pytest_runtest_logreport(report):
    if "test_models.py" not in report.nodeid:
        return
    name = report.nodeid.split("[", 1)[-1].rstrip("]")
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome.upper()
        if hasattr(report, "wasxfail"):
            outcome = "XFAIL" if report.skipped else "XPASS"
        _model_results.append((name, outcome, "" if report.passed else _first_line(report)))


def pytest_terminal_summary(terminalreporter):
    if not _model_results:
        return
    terminalreporter.section("kiln vs ONNX Runtime, per model")
    width = max(len(name) for name, _, _ in _model_results)
    for name, outcome, reason in _model_results:
        terminalreporter.write_line(f"{name:<{width}}  {outcome:<7} {reason[:400]}")
