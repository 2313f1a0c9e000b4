"""scripts/demo.py, as `bash scripts/demo.sh` runs it, on the first 1,000 test images: it names
the class of one test image of each class with both engines, measures fp32 and INT8 accuracy and
speed, draws the chart and writes the JSON; the demo itself fails when the accuracy is not the
trained model's. CTest runs this with PYTHONPATH=<build>/python.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def test_demo_classifies_real_images_and_draws_its_chart(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "demo.py"), "--device", "cpu", "--images", "1000",
                        "--calib-images", "512", "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    with open(tmp_path / "demo.json") as f:
        r = json.load(f)
    assert r["schema"] == "kiln.demo/1" and r["device"] == "cpu" and r["images"] == 1000
    assert r["calibration_images"] == 512
    # One image of each class, named; the trained model gets at least 8 of these 10 right.
    assert [s["label"] for s in r["samples"]] == CLASSES
    assert sum(s["fp32"] == s["label"] for s in r["samples"]) >= 8
    for s in r["samples"]:
        assert s["fp32"] in CLASSES and s["int8"] in CLASSES and f"{s['label']:<12}" in p.stdout
    assert 0.88 <= r["fp32"]["top1"] <= 0.96, r["fp32"]
    assert abs(r["int8"]["top1"] - r["fp32"]["top1"]) <= 0.01 and r["int8"]["agreement_fp32"] >= 0.97, r["int8"]
    assert r["int8"]["int8_convolutions"] > 0
    for precision in ("fp32", "int8"):
        assert r[precision]["batch1_ms"] > 0 and r[precision]["images_per_s"] > 0
    with open(tmp_path / "demo.png", "rb") as f:
        png = f.read()
    assert png.startswith(b"\x89PNG") and len(png) > 20000
