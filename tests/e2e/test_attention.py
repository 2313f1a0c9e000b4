"""ONNX's Attention op on kiln's CPU engine against ONNX Runtime, through `kiln check` (every output:
Y, present_key, present_value, the logits), in the forms models use: 3-D and 4-D inputs, grouped
KV heads, boolean and additive masks, causal masking with and without a past cache, a soft cap,
an explicit scale, each mode of the logits output."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

B, S, KV, PAST = 2, 5, 7, 3  # batch, queries, new keys, cached keys


def attention_model(path, *, three_d, q_heads=4, kv_heads=4, head=8, v_head=8, mask=None, past=False, attrs=None,
                    opset=23):
    """mask: None, "bool" or "float", [q, keys] (ONNX Runtime refuses masks shorter than the keys,
    which kiln pads as onnx's reference does: the conformance cases cover that)."""
    if three_d:
        shapes = {"Q": [B, S, q_heads * head], "K": [B, KV, kv_heads * head], "V": [B, KV, kv_heads * v_head]}
        attrs = {"q_num_heads": q_heads, "kv_num_heads": kv_heads, **(attrs or {})}
    else:
        shapes = {"Q": [B, q_heads, S, head], "K": [B, kv_heads, KV, head], "V": [B, kv_heads, KV, v_head]}
        attrs = attrs or {}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()]
    names = ["Q", "K", "V"]
    total = KV + (PAST if past else 0)
    if mask:
        elem = TensorProto.BOOL if mask == "bool" else TensorProto.FLOAT
        inputs.append(helper.make_tensor_value_info("mask", elem, [S, total]))
        names.append("mask")
    if past:
        names += [""] * (4 - len(names)) + ["past_key", "past_value"]
        inputs += [helper.make_tensor_value_info("past_key", TensorProto.FLOAT, [B, kv_heads, PAST, head]),
                   helper.make_tensor_value_info("past_value", TensorProto.FLOAT, [B, kv_heads, PAST, v_head])]
    outputs = ["Y", "present_key", "present_value", "qk"]
    node = helper.make_node("Attention", names, outputs, name="attention", **attrs)
    graph = helper.make_graph([node], "attention", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                            for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    import onnx

    onnx.save(model, str(path))
    return str(path)


FORMS = {
    "4d": dict(three_d=False),
    "3d": dict(three_d=True),
    "4d_gqa": dict(three_d=False, q_heads=6, kv_heads=2),
    "3d_gqa_v_head": dict(three_d=True, q_heads=4, kv_heads=2, v_head=16),
    "4d_bool_mask": dict(three_d=False, mask="bool"),
    "3d_float_mask": dict(three_d=True, mask="float"),
    "4d_causal": dict(three_d=False, attrs={"is_causal": 1}),
    "3d_causal_past": dict(three_d=True, past=True, attrs={"is_causal": 1}),
    "4d_past_mask": dict(three_d=False, past=True, mask="float"),
    "4d_softcap_scale": dict(three_d=False, attrs={"softcap": 2.0, "scale": 0.3}),
    "4d_softcap_capped_logits": dict(three_d=False, attrs={"softcap": 2.0, "qk_matmul_output_mode": 1}),
    "4d_logits_with_bias": dict(three_d=False, mask="float", attrs={"qk_matmul_output_mode": 2}),
    "4d_probabilities": dict(three_d=False, attrs={"is_causal": 1, "qk_matmul_output_mode": 3}),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_attention_matches_onnxruntime(form, run_kiln, tmp_path):
    model = attention_model(tmp_path / "attention.onnx", **FORMS[form])
    # Masks: a boolean one allows a random 80% of the keys; an additive one is small noise with
    # some -inf, as models build them.
    rng = np.random.default_rng(5)
    import onnx

    feeds = []
    for inp in onnx.load(model).graph.input:
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        if inp.name == "mask" and inp.type.tensor_type.elem_type == TensorProto.BOOL:
            x = rng.random(shape) < 0.8
        elif inp.name == "mask":
            x = np.where(rng.random(shape) < 0.2, -np.inf, rng.standard_normal(shape)).astype(np.float32)
        else:
            x = rng.standard_normal(shape).astype(np.float32)
        np.save(tmp_path / f"{inp.name}.npy", x)
        feeds += ["--inputs", f"{inp.name}={tmp_path / (inp.name + '.npy')}"]
    r = run_kiln("check", model, *feeds, "--no-bisect")
    assert r.returncode == 0, r.describe()
    for output in ("Y", "present_key", "present_value", "qk"):
        assert f"ok    {output}" in r.stdout, r.stdout
