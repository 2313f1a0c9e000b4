#!/usr/bin/env python3
"""kiln's pipeline end to end on the CPU (run through scripts/demo.sh).

1. export torchvision's ResNet-18 (random weights: nothing is downloaded) to ONNX, dynamic batch;
2. take an image from Fashion-MNIST (Debian's dataset-fashion-mnist), make it a 224x224 RGB
   ImageNet-normalised tensor;
3. `kiln run`: import, optimize, build the CPU engine, run, print the top-5 classes;
4. run the same model in ONNX Runtime and print how close kiln's output is.

With random weights the classes mean nothing; the point is that kiln computes what ONNX
Runtime computes. Files go to out/demo/.
"""
from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_model  # noqa: E402

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def read_fashion_mnist(index: int) -> tuple[np.ndarray, str]:
    """Image `index` of the Fashion-MNIST test set (28x28 uint8) and its class name. The files
    are IDX: a big-endian header (magic, count, rows, cols) then the raw bytes."""
    with gzip.open(os.path.join(FASHION_MNIST, "t10k-images-idx3-ubyte.gz")) as f:
        magic, count, rows, cols = np.frombuffer(f.read(16), dtype=">u4")
        if magic != 2051 or not 0 <= index < count:
            raise SystemExit(f"demo: bad Fashion-MNIST image file or index {index} (0..{count - 1})")
        f.seek(16 + index * rows * cols)
        image = np.frombuffer(f.read(rows * cols), dtype=np.uint8).reshape(rows, cols)
    with gzip.open(os.path.join(FASHION_MNIST, "t10k-labels-idx1-ubyte.gz")) as f:
        f.seek(8 + index)
        label = f.read(1)[0]
    return image, FASHION_CLASSES[label]


def to_input(image: np.ndarray, size: int) -> np.ndarray:
    """28x28 gray -> [1, 3, size, size] float32, ImageNet-normalised, as the model expects."""
    from PIL import Image

    big = Image.fromarray(image).resize((size, size), Image.BILINEAR).convert("RGB")
    x = np.asarray(big, dtype=np.float32) / 255.0
    x = (x - IMAGENET_MEAN) / IMAGENET_STD
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kiln", default="build/kiln", help="the kiln binary")
    p.add_argument("--model", default="resnet18", help="torchvision model to export")
    p.add_argument("--image", type=int, default=0, help="index of the Fashion-MNIST test image")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--out", default="out/demo")
    a = p.parse_args()
    if not os.access(a.kiln, os.X_OK):
        raise SystemExit(f"demo: {a.kiln} not found: build kiln first (bash scripts/setup.sh)")
    os.makedirs(a.out, exist_ok=True)

    onnx_path = os.path.join(a.out, f"{a.model}.onnx")
    print(f"==> 1. export {a.model} (random weights, dynamic batch, opset 17) to {onnx_path}", flush=True)
    if os.path.exists(onnx_path):
        print("    (already exported)")
    else:
        t = time.perf_counter()
        export_model.export(export_model.load_model(a.model, size=a.size), onnx_path, "torchscript", 17)
        print(f"    done in {time.perf_counter() - t:.1f} s")

    image, label = read_fashion_mnist(a.image)
    x = to_input(image, a.size)
    input_path = os.path.join(a.out, "input.npy")
    np.save(input_path, x)
    from PIL import Image
    Image.fromarray(image).save(os.path.join(a.out, "image.png"))
    print(f"\n==> 2. input: Fashion-MNIST test image {a.image} (class: {label}), as a {list(x.shape)} tensor in {input_path}")

    out_dir = os.path.join(a.out, "kiln")
    cmd = [a.kiln, "run", onnx_path, "--input", f"input={input_path}", "--top-k", "5", "--output-dir", out_dir]
    print(f"\n==> 3. {' '.join(cmd)}", flush=True)
    if subprocess.run(cmd).returncode != 0:
        print("demo: kiln run failed (see its message above)", file=sys.stderr)
        return 1

    print("\n==> 4. the same model in ONNX Runtime", flush=True)
    want = export_model.run_ort(onnx_path, {"input": x})[0]
    got = np.load(os.path.join(out_dir, "output.npy"))
    err = export_model.relative_l2(got, want)
    top_kiln = np.argsort(-got[0])[:5].tolist()
    top_ort = np.argsort(-want[0])[:5].tolist()
    print(f"    top-5 classes, kiln:         {top_kiln}")
    print(f"    top-5 classes, ONNX Runtime: {top_ort}")
    print(f"    relative L2 error of kiln's output: {err:.2e}")
    print("    (random weights: the ImageNet classes mean nothing here; the outputs agreeing is the point)")
    if not err <= 1e-4:
        print("demo: kiln's output differs from ONNX Runtime's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
