#!/usr/bin/env python3
"""Trains kiln's real-data test model: a small ResNet on Fashion-MNIST, from Debian's
dataset-fashion-mnist files (train split), and exports it to ONNX.

    .venv/bin/python scripts/train_fashion_mnist.py [--epochs 2] [-o models/fashion_mnist_resnet.onnx]

The network: a 3x3 stem (1 -> 16 channels), three stages of two BasicBlocks (16, 32, 64
channels; stride 2 between stages; BatchNorm, residual adds, ReLU), global average pooling and
a 10-way Linear layer. Inputs are (pixel / 255 - MEAN) / STD, shape [N, 1, 28, 28]. Writes the
ONNX (opset 17, dynamic batch "batch", input "input", output "logits") and a JSON beside it
with the normalization, the epochs, the command and the test-split accuracy PyTorch measured.
Seeds are fixed: a rerun writes the committed model bit for bit (PyTorch test top-1 0.9117).
On a 2-core machine the default two epochs take 3 to 9 minutes, with the load.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530


def load_split(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 28, 28) uint8 and labels (N,) of 'train' or 't10k'."""
    with gzip.open(os.path.join(DATA, f"{split}-images-idx3-ubyte.gz")) as f:
        raw = f.read()
    n, rows, cols = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
    images = np.frombuffer(raw, np.uint8, offset=16).reshape(n, rows, cols)
    with gzip.open(os.path.join(DATA, f"{split}-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return images, labels


def normalize(images: np.ndarray) -> np.ndarray:
    return ((images.astype(np.float32) / 255.0 - MEAN) / STD)[:, None, :, :]


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


class FashionResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        blocks, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("-o", "--output", default="models/fashion_mnist_resnet.onnx")
    args = ap.parse_args()
    torch.manual_seed(0)
    np.random.seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    train_x, train_y = load_split("train")
    test_x, test_y = load_split("t10k")
    xt, yt = torch.from_numpy(normalize(train_x)), torch.from_numpy(train_y.astype(np.int64))
    model = FashionResNet()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    steps = args.epochs * (len(xt) // 128)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    start = time.time()
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(xt))
        for i in range(len(xt) // 128):
            idx = perm[i * 128:(i + 1) * 128]
            xb = xt[idx]
            if epoch < args.epochs - 1:  # light augmentation: random horizontal flips
                flip = torch.rand(len(xb)) < 0.5
                xb = torch.where(flip[:, None, None, None], xb.flip(3), xb)
            loss = F.cross_entropy(model(xb), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            if i % 100 == 0:
                print(f"\repoch {epoch + 1}/{args.epochs} step {i}/{len(xt) // 128} loss {loss.item():.3f} "
                      f"({time.time() - start:.0f} s)", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(torch.from_numpy(normalize(test_x[i:i + 1000]))) for i in range(0, len(test_x), 1000)])
    accuracy = float((logits.argmax(1).numpy() == test_y).mean())
    top5 = float(np.mean([y in row for y, row in zip(test_y, logits.topk(5, 1).indices.numpy())]))
    print(f"test top-1 {accuracy:.4f}, top-5 {top5:.4f} ({time.time() - start:.0f} s)")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    torch.onnx.export(model, torch.zeros(1, 1, 28, 28), args.output, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17, dynamo=False)
    meta = {"mean": MEAN, "std": STD, "input": "(pixel / 255 - mean) / std, [N, 1, 28, 28] float32",
            "epochs": args.epochs, "torch": torch.__version__, "pytorch_test_top1": accuracy, "pytorch_test_top5": top5,
            "command": "scripts/train_fashion_mnist.py " + " ".join(sys.argv[1:]), "train_seconds": round(time.time() - start)}
    with open(os.path.splitext(args.output)[0] + ".json", "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
