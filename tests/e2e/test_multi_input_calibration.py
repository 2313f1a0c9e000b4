"""Calibration of models of several inputs (src/calibration/calibration_data.h): a transformers
BERT (input_ids, attention_mask, token_type_ids) calibrates from a folder of <input>.npy files,
from subfolders of batches and from Python dicts, all to the same scales; its INT8 engine keeps
every product's residual and stays close to float32; data that cannot feed the model is refused
naming the input and the reason."""
from __future__ import annotations

import re

import numpy as np
import pytest

import export_model

# A tiny BERT: the graph transformers writes for the full-size model, at a size the CPU runs at once.
BERT = "hf:bert:num_hidden_layers=2,hidden_size=32,num_attention_heads=4,intermediate_size=64,vocab_size=97"
SEQ = 12


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """(model path, input names, 16 rows of inputs by name)."""
    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    spec = export_model.load_model(BERT, seq_len=SEQ)
    export_model.export(spec, str(path))
    rows = export_model.input_maker(BERT, seq_len=SEQ)(16, seed=3)
    return str(path), list(spec.input_names), dict(zip(spec.input_names, rows))


def scales_of(cache) -> dict[str, float]:
    scales = {}
    for line in cache.read_text().splitlines():
        m = re.match(r"^(\S+): (\S+)$", line)
        if m and m.group(1) not in ("model", "algorithm", "batches"):
            scales[m.group(1)] = float(m.group(2))
    return scales


def rel_l2(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def test_every_form_of_several_inputs_gives_the_same_scales(bert, run_kiln, tmp_path):
    import kiln

    path, names, rows = bert
    assert len(names) >= 2 and any(rows[n].dtype == np.int64 for n in names)
    files = tmp_path / "files"
    files.mkdir()
    for name in names:
        np.save(files / f"{name}.npy", rows[name])
    result = run_kiln("calibrate", path, "--calib", files, "--batch", "4", "--calib-algo", "minmax", "-o", tmp_path / "files.calib")
    assert result.returncode == 0, result.describe()
    assert "4 batches" in result.stdout + result.stderr
    from_files = scales_of(tmp_path / "files.calib")
    assert len(from_files) > 20

    # The same rows as four subfolders of one batch each.
    batches = tmp_path / "batches"
    for b in range(4):
        (batches / f"{b:03d}").mkdir(parents=True)
        for name in names:
            np.save(batches / f"{b:03d}" / f"{name}.npy", rows[name][4 * b:4 * b + 4])
    result = run_kiln("calibrate", path, "--calib", batches, "--calib-algo", "minmax", "-o", tmp_path / "batches.calib")
    assert result.returncode == 0, result.describe()
    assert scales_of(tmp_path / "batches.calib") == from_files

    # And as Python dicts; the cache writes scales as decimals, so compare closely, not exactly.
    dicts = [{n: rows[n][4 * b:4 * b + 4] for n in names} for b in range(4)]
    from_python = kiln.calibrate(path, dicts, algorithm="minmax", progress=False)
    assert from_python.keys() == from_files.keys()
    for name, scale in from_files.items():
        assert abs(from_python[name] - scale) <= 1e-5 * scale, name


def test_int8_bert_stays_close_to_float32(bert):
    """Every product of the blocks runs as an INT8 convolution (the Q/K/V product, the attention
    output and the feed-forward products with their residuals in the epilogue); the outputs move
    by the quantization step, not by a lost skip connection."""
    import kiln

    path, names, rows = bert
    builder = kiln.Builder(precision="int8")
    builder.calibrate(path, [{n: rows[n][b:b + 4] for n in names} for b in range(0, 12, 4)], progress=False)
    int8 = builder.build(path)
    qconvs = [layer["name"] for layer in int8.info()["layers"] if layer["op"] == "QConv"]
    assert len(qconvs) >= 8, qconvs  # four products in each of the two blocks
    fp32 = kiln.Engine.from_onnx(path)
    held_out = {n: rows[n][12:] for n in names}
    want, got = fp32.run(held_out), int8.run(held_out)
    for name in want:
        err = rel_l2(got[name], want[name])
        assert 0 < err < 0.05, (name, err)


@pytest.mark.parametrize("precision,metric", [("fp8", "cosine"), ("fp8", "relative-l2"), ("int8", "relative-l2")])
def test_accuracy_budget_on_a_transformers_output(precision, metric, bert, run_kiln, tmp_path):
    """--accuracy-budget with --accuracy-metric cosine or relative-l2 measures a model whose output
    is not class scores (BERT's hidden states): with a budget tighter than the all-quantized
    output meets, it keeps the fewest products in float that bring the held-out output within it,
    in INT8 and in FP8; a budget the all-quantized output meets keeps none."""
    path, names, rows = bert
    calib = tmp_path / "calib"
    calib.mkdir()
    for name in names:
        np.save(calib / f"{name}.npy", rows[name])
    inputs = []
    for name in names:
        np.save(tmp_path / f"x_{name}.npy", rows[name][:2])
        inputs += ["--input", f"{name}={tmp_path / f'x_{name}.npy'}"]

    def budget_run(budget):
        result = run_kiln("run", path, f"--{precision}", "--calib", calib, "--calib-batch", "4", "--accuracy-budget",
                          str(budget), "--accuracy-metric", metric, *inputs, "--top-k", "0", "-o", tmp_path / "out")
        assert result.returncode == 0, result.describe()
        return result.stderr

    what = "cosine similarity with float32" if metric == "cosine" else "relative L2 error against float32"
    first = budget_run(1.0)
    m = re.search(rf"all-{precision.upper()} {what} ([\d.]+) \((?:error|cosine) ([\d.]+)\), within budget", first)
    assert m, first
    quantized = float(m.group(1))
    loss = 1 - quantized if metric == "cosine" else quantized
    assert loss > 0, first  # the output was quantized

    log = budget_run(loss / 2)
    m = re.search(r"; (\d+) layer\(s\) kept in float -> ([\d.]+) ", log)
    assert m and "NOT met" not in log, log
    kept, final = int(m.group(1)), float(m.group(2))
    assert 1 <= kept < 8, log  # some products, not all eight
    assert (1 - final if metric == "cosine" else final) <= loss / 2
    assert log.count("alone in float") == kept
    assert re.search(r"kept in float: \S+: pinned to float", log)


def test_accuracy_metric_without_a_budget_is_refused(bert, run_kiln, tmp_path):
    path, names, rows = bert
    np.save(tmp_path / "calib.npy", rows[names[0]])
    result = run_kiln("build", path, "--device", "cpu", "--int8", "--calib", tmp_path / "calib.npy", "--accuracy-metric", "cosine",
                      "-o", tmp_path / "never.engine")
    assert result.returncode != 0
    assert "--accuracy-metric cosine measures for --accuracy-budget, which is not given" in result.stderr
    assert not (tmp_path / "never.engine").exists()
    result = run_kiln("build", path, "--device", "cpu", "--int8", "--accuracy-budget", "1", "--accuracy-metric", "top5",
                      "-o", tmp_path / "never.engine")
    assert result.returncode != 0 and "top5" in result.stdout + result.stderr


def test_data_that_cannot_feed_the_inputs_is_refused(bert, run_kiln, tmp_path):
    import kiln

    path, names, rows = bert

    def calibrate(data):
        result = run_kiln("calibrate", path, "--calib", data, "-o", tmp_path / "never.calib")
        assert result.returncode != 0
        assert not (tmp_path / "never.calib").exists()
        return result.stdout + result.stderr

    missing = tmp_path / "missing"
    missing.mkdir()
    for name in names[:-1]:
        np.save(missing / f"{name}.npy", rows[name])
    assert re.search(rf"no {names[-1]}\.npy for input '{names[-1]}'", calibrate(missing))

    uneven = tmp_path / "uneven"
    uneven.mkdir()
    for i, name in enumerate(names):
        np.save(uneven / f"{name}.npy", rows[name][:16 - i])
    assert "disagree on the number of rows" in calibrate(uneven)

    wrong_type = tmp_path / "wrong_type"
    wrong_type.mkdir()
    for name in names:
        np.save(wrong_type / f"{name}.npy", rows[name].astype(np.float32))
    assert re.search(r"is float32 for input '\w+', which takes int64", calibrate(wrong_type))

    np.save(tmp_path / "one.npy", rows[names[0]])
    assert f"is one file, but the model has {len(names)} inputs" in calibrate(tmp_path / "one.npy")

    with pytest.raises(kiln.Error, match=f"is one array, but .* has {len(names)} inputs"):
        kiln.calibrate(path, [rows[names[0]]], progress=False)
    with pytest.raises(kiln.Error, match="names 'pixels', which is not an input"):
        kiln.calibrate(path, [{**{n: rows[n] for n in names}, "pixels": rows[names[0]]}], progress=False)
