"""`kiln report`: charts and the HTML page from a results file, and the page rendered in headless
Chromium (Debian's chromium package): it loads without script errors and every chart draws."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from kiln import report


def timing(runtime: str, variant: str, batch: int, ms: float) -> dict:
    return {"runtime": runtime, "variant": variant, "precision": variant.split("-")[-1], "batch": batch,
            "latency_ms": {"median": ms, "mean": ms * 1.02, "p90": ms * 1.05, "p99": ms * 1.1, "min": ms * 0.98},
            "throughput": batch * 1000 / ms, "runs": 20}


def sample_results() -> dict:
    results = []
    for b, scale in ((1, 1.0), (8, 5.0)):
        results += [timing("pytorch", "eager-fp32", b, 4.0 * scale), timing("pytorch", "compile", b, 2.5 * scale),
                    timing("kiln", "fp32", b, 2.0 * scale), timing("kiln", "fp16", b, 1.0 * scale)]
        results.append({"runtime": "kiln", "variant": "int8", "precision": "int8", "batch": b,
                        "error": "no calibration data <for this model>"})
    return {
        "schema": "kiln.compare/1", "created": "2026-11-23T00:00:00Z", "command": "kiln compare resnet18",
        "model": {"name": "resnet18", "onnx": "resnet18.onnx", "input": "input", "input_shape": [-1, 3, 224, 224]},
        "device": {"kind": "cuda", "name": "Test GPU", "torch": "2.x", "kiln": "0.1.0"},
        "timing": "CUDA events", "results": results,
        "sizes": [{"runtime": "pytorch", "variant": "eager-fp32", "engine_bytes": 46 << 20},
                  {"runtime": "kiln", "variant": "fp16", "engine_bytes": 23 << 20, "weight_bytes": 22 << 20,
                   "activation_bytes": 50 << 20}],
        "accuracy": {"reference": "pytorch eager-fp32", "inputs": "random",
                     "entries": [{"runtime": "kiln", "variant": "fp16", "top1_agreement": 0.99, "max_abs_diff": 0.01,
                                  "cosine": 0.9999, "relative_l2": 0.00123, "top1": None},
                                 {"runtime": "pytorch", "variant": "compile", "top1_agreement": 1.0,
                                  "max_abs_diff": 1e-5, "cosine": 1.0, "top1": None}]},
    }


def test_report_writes_every_chart_and_the_tables(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(sample_results()))
    written = report.write_report(report.load_results(str(path)), str(tmp_path / "out"))
    assert written["charts"] == ["latency", "throughput", "speedup", "accuracy", "memory"]
    for name in written["charts"]:
        png = tmp_path / "out" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        ET.parse(tmp_path / "out" / f"{name}.svg")  # well-formed SVG
    page = open(written["html"]).read()
    assert page.count("<svg") == 5
    # Self-contained: nothing is loaded from elsewhere (XML namespaces are names, not loads).
    assert not re.search(r"""(src|href)=["'](https?:|//|[^"'#]*\.(png|svg|js|css))""", page)
    assert "<link" not in page and "<img" not in page
    assert "no calibration data &lt;for this model&gt;" in page  # errors listed, escaped
    assert "<th>relative L2</th>" in page and "0.00123" in page
    assert "2.00x" in page and "4.00x" in page  # kiln fp32 and fp16 over eager fp32: 4.0 / 2.0, 4.0 / 1.0
    assert "#76B900" in page


def test_missing_data_leaves_a_chart_out_and_says_so(tmp_path):
    r = sample_results()
    r.pop("sizes")
    r["accuracy"]["entries"] = []
    written = report.write_report(r, str(tmp_path))
    assert "memory" not in written["charts"] and "accuracy" not in written["charts"]
    assert open(written["html"]).read().count("No data for this chart") == 2


def test_bad_files_are_clear_errors(tmp_path, capsys):
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema": "kiln-bench 1", "results": []}))
    with pytest.raises(ValueError, match=r"wrong\.json.*kiln-bench 1"):
        report.load_results(str(wrong))
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"schema": "kiln.compare/1", "model": {}, "results": []}))
    with pytest.raises(ValueError, match=r"partial\.json.*'device'"):
        report.load_results(str(partial))
    assert report.main([str(tmp_path / "missing.json"), "-o", str(tmp_path / "o")]) == 1
    assert "missing.json" in capsys.readouterr().err


def test_page_renders_in_headless_chromium(tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "Chromium is not installed: apt-get install chromium (scripts/setup.sh installs it)"
    written = report.write_report(sample_results(), str(tmp_path))
    p = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom",
                        "file://" + os.path.abspath(written["html"])],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    body = re.search(r"<body[^>]*>", p.stdout)
    assert body, p.stdout[:2000]
    tag = body.group(0)
    expected = re.search(r'data-charts-expected="(\d+)"', tag)
    rendered = re.search(r'data-charts-rendered="(\d+)"', tag)
    assert expected and rendered, f"the page's load handler did not run: {tag}"
    assert int(expected.group(1)) == 5
    assert rendered.group(1) == expected.group(1)
    assert "data-errors" not in tag, tag
