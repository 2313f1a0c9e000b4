#!/usr/bin/env python3
"""kiln on a real task (run through scripts/demo.sh): the Fashion-MNIST classifier of models/
(a small ResNet trained by scripts/train_fashion_mnist.py) on real test images from Debian's
dataset-fashion-mnist.

1. build an fp32 engine, and an INT8 engine calibrated on 1,024 training images;
2. classify one test image of each class, by name, with both engines;
3. accuracy of both on the test split (its 10,000 images; --images N: the first N);
4. time both at batch 1 and batch 256;
5. draw it all in one chart, and write the figures as JSON.

The GPU engine where kiln has its CUDA backend and the machine a GPU (--device auto), else the
CPU engine. Files go to out/demo/ (--out).
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(REPO, "models", "fashion_mnist_resnet.onnx")
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
GREEN, GREY = "#76B900", "#8C8C8C"
BATCH = 256


def read_idx(name: str, count: int) -> np.ndarray:
    """The first `count` items of an IDX file of the dataset (big-endian header, then raw bytes)."""
    path = os.path.join(FASHION_MNIST, name)
    if not os.path.exists(path):
        raise SystemExit(f"demo: {path} is missing: install Debian's dataset-fashion-mnist (bash scripts/setup.sh)")
    with gzip.open(path) as f:
        magic = int.from_bytes(f.read(4), "big")
        dims = [int.from_bytes(f.read(4), "big") for _ in range(magic & 0xFF)]
        count = min(count, dims[0])
        item = int(np.prod(dims[1:], dtype=np.int64))
        return np.frombuffer(f.read(count * item), dtype=np.uint8).reshape([count, *dims[1:]])


def machine() -> dict:
    """The processor and how busy it was: CPU timings on a shared machine vary with its load."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "load_average": [round(v, 2) for v in os.getloadavg()]}


def section(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def build_engines(kiln, device: str, normalize, calib_images: np.ndarray):
    """fp32 and INT8 engines for `device`; GPU engines take batches of 1 to BATCH."""
    profile = [{"input": ([1, 1, 28, 28], [BATCH, 1, 28, 28], [BATCH, 1, 28, 28])}] if device == "cuda" else []
    t = time.perf_counter()
    fp32 = kiln.Builder(precision="fp32", device=device, profiles=profile).build(MODEL)
    fp32_s = time.perf_counter() - t
    t = time.perf_counter()
    builder = kiln.Builder(precision="int8", device=device, profiles=profile)
    batches = [normalize(calib_images[i:i + BATCH]) for i in range(0, len(calib_images), BATCH)]
    builder.calibrate(MODEL, batches, progress=False)
    int8 = builder.build(MODEL)
    int8_s = time.perf_counter() - t
    return fp32, fp32_s, int8, int8_s


def classify(engine, x: np.ndarray) -> np.ndarray:
    """Logits of every image, in batches of at most BATCH."""
    return np.concatenate([engine.run({"input": x[i:i + BATCH]})["logits"] for i in range(0, len(x), BATCH)])


def median_ms(engine, x: np.ndarray, runs: int) -> float:
    engine.run({"input": x})  # warm-up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        engine.run({"input": x})
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def draw(path: str, samples, sample_images, results: dict, device_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(13, 6))
    grid = fig.add_gridspec(2, 10, height_ratios=[1, 1.6], hspace=0.3, wspace=0.25)
    for i, (s, image) in enumerate(zip(samples, sample_images)):
        ax = fig.add_subplot(grid[0, i])
        ax.imshow(image, cmap="gray_r")
        ax.set_xticks([]), ax.set_yticks([])
        ok = s["fp32"] == s["label"] and s["int8"] == s["label"]
        ax.set_title(f"{s['label']}\nfp32: {s['fp32']}\nINT8: {s['int8']}", fontsize=7.5,
                     color="black" if ok else "#C00000")
    names = ["fp32", "INT8"]
    panels = [
        (f"top-1 accuracy, {results['images']:,} test images", [results[p]["top1"] * 100 for p in ("fp32", "int8")], "%"),
        ("latency at batch 1 (median)", [results[p]["batch1_ms"] for p in ("fp32", "int8")], "ms"),
        ("throughput at batch %d" % BATCH, [results[p]["images_per_s"] for p in ("fp32", "int8")], "images/s"),
    ]
    for j, (title, values, unit) in enumerate(panels):
        ax = fig.add_subplot(grid[1, 3 * j + (0 if j == 0 else 1):3 * j + 3])
        bars = ax.bar(names, values, color=[GREY, GREEN], width=0.6)
        formats = {"%": "{:.2f} %", "ms": "{:.3g} ms", "images/s": "{:,.0f} images/s"}
        ax.bar_label(bars, labels=[formats[unit].format(v) for v in values], fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.spines[["top", "right"]].set_visible(False)
        ax.tick_params(labelsize=8)
        if unit == "%":
            ax.set_ylim(min(values) - 5, 100)
        else:
            ax.set_ylim(0, max(values) * 1.2)
    fig.suptitle(f"kiln {results['kiln_version']}: the Fashion-MNIST ResNet of models/ on {device_name}", fontsize=11)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: the GPU when kiln has its CUDA backend and the machine a GPU, else the CPU")
    p.add_argument("--images", type=int, default=10000, help="test images to measure accuracy on (the first N)")
    p.add_argument("--calib-images", type=int, default=1024, help="training images to calibrate INT8 on")
    p.add_argument("--out", default="out/demo")
    a = p.parse_args()
    try:
        import kiln
    except ImportError as e:
        raise SystemExit(f"demo: cannot import kiln ({e}): build it first (bash scripts/setup.sh), and run "
                         "through scripts/demo.sh, which puts build/python on the path")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(REPO, "models", "fashion_mnist_resnet.json")) as f:
        trained = json.load(f)

    def normalize(images: np.ndarray) -> np.ndarray:  # as scripts/train_fashion_mnist.py trains
        return ((images.astype(np.float32) / 255.0 - trained["mean"]) / trained["std"]).reshape(-1, 1, 28, 28)

    calib = read_idx("train-images-idx3-ubyte.gz", a.calib_images)
    device = a.device
    if device == "auto":
        device = "cuda" if kiln.has_cuda else "cpu"
    section(f"1. build engines of {os.path.relpath(MODEL, REPO)} (kiln {kiln.__version__})")
    try:
        fp32, fp32_s, int8, int8_s = build_engines(kiln, device, normalize, calib)
    except kiln.Error as e:
        if a.device != "auto":
            raise
        print(f"    no GPU engine here ({str(e).split('Hint:')[0].strip()})\n    so: the CPU engine")
        device = "cpu"
        fp32, fp32_s, int8, int8_s = build_engines(kiln, device, normalize, calib)
    device_name = "the GPU" if device == "cuda" else "the CPU"
    if device == "cpu":
        device_name = f"the CPU ({os.cpu_count()} cores)"
    int8_info = int8.info()
    int8_convolutions = sum(1 for layer in int8_info["layers"] if layer["op"] == "QConv")  # kiln::QConv
    print(f"    fp32: {fp32.layer_count} layers after fusion, on {device_name}, built in {fp32_s:.1f} s")
    print(f"    INT8: calibrated on {len(calib):,} training images, {int8_convolutions} convolutions in INT8, built in {int8_s:.1f} s")

    count = min(max(a.images, 1), 10000)
    test_images = read_idx("t10k-images-idx3-ubyte.gz", count)
    labels = read_idx("t10k-labels-idx1-ubyte.gz", count).astype(np.int64)
    x = normalize(test_images)

    section("2. one test image of each class, classified by both engines")
    picks = [int(np.flatnonzero(labels == c)[0]) for c in range(10) if (labels == c).any()]
    p32 = softmax(classify(fp32, x[picks]))
    p8 = softmax(classify(int8, x[picks]))
    samples = []
    print(f"    {'image':>5}  {'true class':<12} {'fp32 says':<24} {'INT8 says':<24}")
    for row, i in enumerate(picks):
        s = {"image": i, "label": CLASSES[labels[i]], "fp32": CLASSES[int(p32[row].argmax())],
             "int8": CLASSES[int(p8[row].argmax())], "fp32_confidence": float(p32[row].max()),
             "int8_confidence": float(p8[row].max())}
        samples.append(s)
        mark = "" if s["fp32"] == s["label"] and s["int8"] == s["label"] else "   <- wrong"
        said32 = f"{s['fp32']} ({s['fp32_confidence']:.0%})"
        said8 = f"{s['int8']} ({s['int8_confidence']:.0%})"
        print(f"    {i:>5}  {s['label']:<12} {said32:<24} {said8:<24}{mark}")

    section(f"3. accuracy on the test split: {'all' if count == 10000 else f'{count:,} of'} its 10,000 images")
    t = time.perf_counter()
    pred32 = classify(fp32, x).argmax(axis=1)
    t32 = time.perf_counter() - t
    t = time.perf_counter()
    pred8 = classify(int8, x).argmax(axis=1)
    t8 = time.perf_counter() - t
    results = {"schema": "kiln.demo/1", "kiln_version": kiln.__version__, "command": " ".join(["bash scripts/demo.sh", *sys.argv[1:]]),
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": machine(), "device": device, "images": count, "calibration_images": len(calib), "samples": samples,
               "fp32": {"top1": float((pred32 == labels).mean()), "seconds": t32},
               "int8": {"top1": float((pred8 == labels).mean()), "seconds": t8,
                        "agreement_fp32": float((pred8 == pred32).mean()), "int8_convolutions": int8_convolutions}}
    print(f"    fp32  top-1 {results['fp32']['top1']:.4f}   ({t32:.1f} s)")
    print(f"    INT8  top-1 {results['int8']['top1']:.4f}   ({t8:.1f} s); the same class as fp32 for "
          f"{results['int8']['agreement_fp32']:.2%} of the images")
    if count == 10000:
        print(f"    (PyTorch measured top-1 {trained['pytorch_test_top1']} on these images after training)")

    section(f"4. speed on {device_name}: median of several runs, numpy arrays in and out")
    one, full = x[:1], np.resize(x, (BATCH, 1, 28, 28))  # the first BATCH test images, repeated if fewer
    for name, engine in (("fp32", fp32), ("int8", int8)):
        b1 = median_ms(engine, one, 20)
        bb = median_ms(engine, full, 5 if device == "cpu" else 50)
        results[name].update(batch1_ms=b1, batch_ms=bb, batch=BATCH, images_per_s=BATCH * 1000 / bb)
        print(f"    {name.upper() if name == 'int8' else name:<5} batch 1: {b1:8.2f} ms   batch {BATCH}: {bb:8.1f} ms"
              f" = {BATCH * 1000 / bb:8.0f} images/s")
    if device == "cpu":
        print("    (on the CPU, INT8 runs kiln's exact integer reference of its GPU INT8 kernels: it shows\n"
              "     the accuracy INT8 gives, not INT8's speed, which is the GPU's)")

    chart = os.path.join(a.out, "demo.png")
    draw(chart, samples, [test_images[i] for i in picks], results, device_name)
    results["machine"]["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    with open(os.path.join(a.out, "demo.json"), "w") as f:
        json.dump(results, f, indent=1)
    section(f"5. chart: {chart}; figures: {os.path.join(a.out, 'demo.json')}")

    # The demo shows something true, or fails: kiln's fp32 engine reproduces the trained model,
    # and INT8 stays within a point of it.
    wrong = [s for s in samples if s["fp32"] != s["label"]]
    if results["fp32"]["top1"] < 0.88 or abs(results["int8"]["top1"] - results["fp32"]["top1"]) > 0.01 or len(wrong) > 2:
        print("demo: the accuracy is not what the trained model gives (fp32 top-1 about 0.91, INT8 within 0.01)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
