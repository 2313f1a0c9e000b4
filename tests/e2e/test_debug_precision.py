"""`kiln debug precision`: every quantized layer's sensitivity and the fewest layers of an INT8 model
to keep in float for a tolerance, on the CPU engine, with the kiln build flags that keep them."""
from __future__ import annotations

import json
import os
import shlex

from test_errors import assert_clean_error

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASHION = os.path.join(REPO, "models", "fashion_mnist_resnet.onnx")


def test_a_tight_budget_keeps_the_most_sensitive_layers_in_float(run_kiln, tmp_path):
    """A cosine budget tighter than the all-INT8 output's: the report ranks every quantized layer,
    keeps the first ones in float until the budget is met, and the build command it prints keeps
    exactly those in float."""
    report = tmp_path / "report.json"
    r = run_kiln("debug", "precision", FASHION, "--calib", "fashion-mnist", "--calib-batches", "6", "--metric", "cosine",
                 "--budget", "0.0001", "--json", report)
    assert r.returncode == 0, r.describe()
    analysis = json.loads(report.read_text())
    assert analysis["metric"] == "cosine" and analysis["met"]
    assert 1 - analysis["all_quantized"]["cosine"] > 0.0001  # the all-INT8 output misses the budget
    assert 1 - analysis["with_float_layers"]["cosine"] <= 0.0001
    ranked = [entry["layer"] for entry in analysis["ranking"]]
    assert len(ranked) == len(set(ranked)) >= 10
    errors = [entry["alone_in_float"]["relative_l2"] for entry in analysis["ranking"]]
    assert errors == sorted(errors)
    kept = analysis["float_layers"]
    assert kept and kept == ranked[:len(kept)]
    for layer in ranked:
        assert layer in r.stdout
    command = shlex.split(r.stdout.split("build it so: ", 1)[1].splitlines()[0])
    assert [a for a in command if a.endswith("=fp16")] == [f"{layer}=fp16" for layer in kept]
    built = run_kiln(*command[1:], "--device", "cpu", "--calib-batches", "6", "-o", tmp_path / "m.engine")
    assert built.returncode == 0, built.describe()
    assert f"{len(kept)} convolution(s) kept in float" in built.stdout + built.stderr, built.describe()


def test_a_budget_the_quantized_model_meets_keeps_nothing(run_kiln, tmp_path):
    r = run_kiln("debug", "precision", FASHION, "--calib", "fashion-mnist", "--calib-batches", "6", "--budget", "5")
    assert r.returncode == 0, r.describe()
    assert "nothing to keep in float" in r.stdout and "--layer-precision" not in r.stdout, r.describe()
    assert "each of the" in r.stdout  # the sensitivity of every layer all the same


def test_usage_errors(run_kiln, tmp_path):
    assert_clean_error(run_kiln("debug", "precision", tmp_path / "missing.onnx", "--calib", "fashion-mnist"), "missing.onnx")
    assert_clean_error(run_kiln("debug", "precision", FASHION), "--calib")
    assert_clean_error(run_kiln("debug", "precision", FASHION, "--calib", "fashion-mnist", "--budget", "-1"),
                       "a tolerance is not negative")
    assert_clean_error(run_kiln("debug", "precision", FASHION, "--calib", tmp_path / "nothing.npy"), "nothing.npy")
