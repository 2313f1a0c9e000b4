"""TensorFlow to kiln, end to end: a small Keras classifier trained on Fashion-MNIST's train split,
saved as a SavedModel, turned into ONNX by `kiln export --from savedmodel` (tf2onnx), and run by
kiln: the SavedModel, ONNX Runtime and kiln agree on real test images.

Runs in the TensorFlow environment .venv-tf (scripts/setup.sh: tensorflow-cpu, tf2onnx,
onnxruntime, pytest), separate from .venv so TensorFlow's pins never move torch's; kiln's
command line hands `kiln export` to that Python through KILN_PYTHON.
"""
from __future__ import annotations

import gzip
import os
import subprocess
import sys

import numpy as np

FASHION_DIR = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


def load_split(prefix: str) -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(os.path.join(FASHION_DIR, f"{prefix}-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28, 1)
    with gzip.open(os.path.join(FASHION_DIR, f"{prefix}-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return images.astype(np.float32) / 255.0, labels


def test_keras_savedmodel_onnx_and_kiln_agree_on_fashion_mnist(kiln_bin, tmp_path):
    import tensorflow as tf

    x_train, y_train = load_split("train")
    x_test, y_test = load_split("t10k")
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10),
    ])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x_train[:30000], y_train[:30000], epochs=1, batch_size=64, verbose=0)
    saved = tmp_path / "savedmodel"
    model.export(str(saved))

    onnx_path = tmp_path / "fashion_keras.onnx"
    env = dict(os.environ, KILN_PYTHON=sys.executable)
    p = subprocess.run([kiln_bin, "export", "--from", "savedmodel", str(saved), "-o", str(onnx_path)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "ONNX Runtime vs TensorFlow relative L2 error" in p.stdout

    x = x_test[:1000]
    want = tf.saved_model.load(str(saved)).signatures["serving_default"](tf.constant(x))
    want = next(iter(want.values())).numpy()
    np.save(tmp_path / "x.npy", x)
    import onnx

    input_name = onnx.load(str(onnx_path)).graph.input[0].name
    r = subprocess.run([kiln_bin, "run", str(onnx_path), "--input", f"{input_name}={tmp_path / 'x.npy'}",
                        "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    outputs = list((tmp_path / "out").glob("*.npy"))
    assert len(outputs) == 1
    got = np.load(outputs[0])
    assert got.shape == (1000, 10)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.array_equal(got.argmax(1), want.argmax(1))
    accuracy = float(np.mean(got.argmax(1) == y_test[:1000]))
    print(f"Keras classifier through kiln: top-1 {accuracy:.3f} on 1000 Fashion-MNIST test images")
    assert accuracy > 0.8, accuracy  # a trained model, so agreement is not agreement on noise
