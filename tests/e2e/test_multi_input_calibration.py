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
