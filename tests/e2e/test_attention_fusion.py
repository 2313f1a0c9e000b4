"""Attention fusion (src/passes/fuse_attention.cc): scaled dot-product attention as exporters write
it (MatMul(Q, K^T), a scalar scale on Q, K, K^T or the scores, an additive mask, Softmax on the
last axis, MatMul(P, V)) becomes one ONNX Attention layer. Each form, built with onnx.helper or
exported from small PyTorch modules (TorchScript at opset 17, one through dynamo), must leave
`kiln inspect --optimize` with one Attention layer per attention and no Softmax, and `kiln check`
must still match ONNX Runtime at 1e-4 on seeded inputs. Near misses (probabilities or scores read
elsewhere, a softmax on another axis) stay unfused with a note saying why, and the one documented
difference in meaning (a row whose mask hides every key: zeros, not the softmax's NaN) is pinned."""
from __future__ import annotations

import json
import math
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

B, H, S, T, D = 2, 3, 7, 11, 8  # batch, query heads, queries, keys, head size (none a multiple of 8 but D)


def _save(path, nodes, inputs, outputs, initializers, opset):
    model = helper.make_model(helper.make_graph(nodes, "attention", inputs, outputs, initializers),
                              opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def _inspect(run_kiln, path) -> dict:
    r = run_kiln("inspect", path, "--optimize", "--json", "-")
    assert r.returncode == 0, r.describe()
    return json.loads(r.stdout)


def _verbose(run_kiln, path) -> str:
    r = run_kiln("inspect", path, "--optimize", "-v")
    assert r.returncode == 0, r.describe()
    return r.stdout + r.stderr


def _assert_fused(run_kiln, path, attentions: int) -> None:
    """`attentions` attention layers (Attention, or StridedAttention where the heads are views)
    after kiln's passes, no Softmax left, no attention note."""
    info = _inspect(run_kiln, path)
    ops = [layer["op"] for layer in info["layers"]]
    notes = [n for n in info["pass_notes"] if n.startswith("attention at Softmax")]
    fused = ops.count("Attention") + ops.count("StridedAttention")
    if fused != attentions or "Softmax" in ops or notes:
        pytest.fail(f"expected {attentions} Attention layer(s) and no Softmax, got ops {ops}\n"
                    f"kiln inspect --optimize -v:\n{_verbose(run_kiln, path)}")


# --- forms built with onnx.helper ---------------------------------------------------------------


def sdpa_model(path, *, rank=4, keys="transpose", scale="div", mask=None, kv_heads=H, head=D, v_head=D, axis=-1,
               opset=17, seed=0, extra_outputs=(), cast=None):
    """One attention, written out: returns (model path, feed).

    keys: "transpose" (K [.., T, d], Transpose of its last two axes), "bert" (K [B, T, H, d],
    Transpose perm (0, 2, 3, 1)), "given" (K^T [.., d, T] is the input).
    scale: "div" / "mul" (the scores divided by sqrt(d) / times 1/sqrt(d)), "q_k" (Q and K times
    d**-0.25 before K's transpose), "q_kt" (Q and K^T times d**-0.25, the constant on Q's left).
    mask: None, "padding" ([B, 1, 1, T] input, float32 min on padded keys), "causal_inf" /
    "causal_1e9" (constant [S, T], -inf / -1e9 above the diagonal), "full" ([B, H, S, T] input,
    added on the Add's left), "bst" (3-D: [B, S, T] input with some -inf).
    axis: the Softmax's axis attribute (None: the default, the last).
    cast: None, "float" (a Cast to float32 after the Softmax, as transformers writes softmax(...,
    dtype=float32).to(query.dtype)) or "float16_and_back" (Casts to float16 and back: not fused)."""
    rng = np.random.default_rng(seed)
    lead, kv_lead = ([B, H], [B, kv_heads]) if rank == 4 else ([B], [B])
    swap = list(range(rank - 2)) + [rank - 1, rank - 2]
    inputs, feed, nodes, inits = [], {}, [], []

    def add_input(name, shape, value=None):
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        feed[name] = (rng.standard_normal(shape) if value is None else value).astype(np.float32)

    def const(name, value, shape=()):
        inits.append(numpy_helper.from_array(np.full(shape, value, dtype=np.float32), name))
        return name

    add_input("q", lead + [S, head])
    q = "q"
    if scale in ("q_k", "q_kt"):
        nodes.append(helper.make_node("Mul", [q, const("q_factor", head ** -0.25, [1])] if scale == "q_k"
                                      else [const("q_factor", head ** -0.25, [1]), q], ["q_scaled"]))
        q = "q_scaled"
    if keys == "given":
        add_input("k_t", kv_lead + [head, T])
        k_t = "k_t"
    else:
        if keys == "bert":
            assert rank == 4 and kv_heads == H
            add_input("k", [B, T, H, head])
            perm = [0, 2, 3, 1]
        else:
            add_input("k", kv_lead + [T, head])
            perm = swap
        k = "k"
        if scale == "q_k":
            nodes.append(helper.make_node("Mul", [k, const("k_factor", head ** -0.25)], ["k_scaled"]))
            k = "k_scaled"
        nodes.append(helper.make_node("Transpose", [k], ["k_t"], perm=perm))
        k_t = "k_t"
    if scale == "q_kt":
        nodes.append(helper.make_node("Mul", [k_t, const("k_factor", head ** -0.25)], ["k_t_scaled"]))
        k_t = "k_t_scaled"
    add_input("v", kv_lead + [T, v_head])
    nodes.append(helper.make_node("MatMul", [q, k_t], ["scores"]))
    scores = "scores"
    if scale in ("div", "mul"):
        op, c = ("Div", math.sqrt(head)) if scale == "div" else ("Mul", 1 / math.sqrt(head))
        nodes.append(helper.make_node(op, [scores, const("scale", c)], ["scores_scaled"]))
        scores = "scores_scaled"
    if mask:
        if mask == "padding":
            m = np.zeros([B, 1, 1, T], np.float32)
            m[1, ..., -3:] = np.finfo(np.float32).min
            add_input("mask", [B, 1, 1, T], m)
        elif mask.startswith("causal"):
            hidden = -np.inf if mask == "causal_inf" else -1e9
            # Bottom-right aligned, as with cached keys: query i sees keys 0 .. i + T - S.
            const("mask", np.triu(np.full([S, T], hidden, np.float32), k=T - S + 1), [S, T])
        elif mask == "full":
            add_input("mask", [B, H, S, T])
        elif mask == "bst":
            m = np.where(rng.random([B, S, T]) < 0.3, -np.inf, rng.standard_normal([B, S, T]))
            m[..., 0] = 0.0  # no row hides every key
            add_input("mask", [B, S, T], m)
        nodes.append(helper.make_node("Add", ["mask", scores] if mask == "full" else [scores, "mask"], ["logits"]))
        scores = "logits"
    softmax_attrs = {} if axis is None else {"axis": axis}
    nodes.append(helper.make_node("Softmax", [scores], ["probs"], name="softmax", **softmax_attrs))
    probs = "probs"
    for i, to in enumerate({None: [], "float": [TensorProto.FLOAT],
                            "float16_and_back": [TensorProto.FLOAT16, TensorProto.FLOAT]}[cast]):
        nodes.append(helper.make_node("Cast", [probs], [f"probs_cast{i}"], name=f"cast{i}", to=to))
        probs = f"probs_cast{i}"
    nodes.append(helper.make_node("MatMul", [probs, "v"], ["y"], name="pv"))
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [f"{name}_{i}" for i in range(rank)])
               for name in ("y", *extra_outputs)]
    return _save(path, nodes, inputs, outputs, inits, opset), feed


FORMS = {
    "div_scores": dict(scale="div"),
    "mul_scores": dict(scale="mul", axis=None),
    "scaled_q_and_k": dict(scale="q_k"),
    "scaled_q_and_k_transposed": dict(scale="q_kt", axis=3),
    "padding_mask": dict(mask="padding"),
    "causal_mask_inf": dict(mask="causal_inf"),
    "causal_mask_1e9": dict(mask="causal_1e9", scale="mul"),
    "full_mask_on_the_left": dict(mask="full", scale="q_k"),
    "bert_keys": dict(keys="bert", mask="padding", head=16, v_head=16),
    "keys_given_transposed": dict(keys="given", scale="mul"),
    "shared_kv_head": dict(kv_heads=1, mask="causal_inf", v_head=16),
    "shared_kv_head_scaled_q_and_k": dict(kv_heads=1, scale="q_k", mask="padding"),
    "bmm": dict(rank=3),
    "bmm_mask": dict(rank=3, mask="bst", scale="q_kt"),
    "div_scores_opset13": dict(opset=13),
    "div_scores_opset23": dict(opset=23),
    "padding_mask_opset23": dict(mask="padding", opset=23, scale="q_k"),
    "bmm_mask_opset23": dict(rank=3, mask="bst", opset=23),
    "probabilities_cast_to_float": dict(mask="padding", cast="float"),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_form_fuses_and_matches_onnxruntime(form, run_kiln, tmp_path, check_against_onnxruntime):
    path, feed = sdpa_model(tmp_path / f"{form}.onnx", seed=sorted(FORMS).index(form), **FORMS[form])
    _assert_fused(run_kiln, path, 1)
    check_against_onnxruntime(path, feed)


# --- near misses: a Softmax between two MatMuls that must stay as it is --------------------------

NEAR_MISSES = {
    "probabilities_also_an_output": (dict(extra_outputs=("probs",)), "the probabilities are also read elsewhere"),
    "scores_also_an_output": (dict(extra_outputs=("scores_scaled",)),
                              "the scores 'scores_scaled' are also read elsewhere"),
    "softmax_along_axis_2": (dict(axis=2), "the softmax runs along axis 2, not the last"),
    "probabilities_through_float16": (dict(cast="float16_and_back"),
                                      "its probabilities reach MatMul 'pv' through Cast 'cast0', Cast 'cast1', not directly"),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_near_miss_is_not_fused_and_says_why(case, run_kiln, tmp_path, check_against_onnxruntime):
    kwargs, why = NEAR_MISSES[case]
    path, feed = sdpa_model(tmp_path / f"{case}.onnx", mask="padding", **kwargs)
    ops = [layer["op"] for layer in _inspect(run_kiln, path)["layers"]]
    assert "Attention" not in ops and ops.count("Softmax") == 1, ops
    text = _verbose(run_kiln, path)
    assert "note: attention at Softmax 'softmax' not fused: " + why in text, text
    check_against_onnxruntime(path, feed)


# --- the documented difference: a row whose mask hides every key --------------------------------


def test_fully_masked_row_gives_zeros_where_softmax_gives_nan(run_kiln, tmp_path):
    """Attention's definition gives a row that may attend to no key zeros; the unfused softmax (ONNX
    Runtime, kiln with --no-optimize) gives NaN. Every other row agrees."""
    m = np.zeros([B, 1, S, T], np.float32)
    m[1, 0, 2, :] = -np.inf  # batch 1, query 2: every key hidden
    m[0, 0, :, -2:] = -np.inf
    path, feed = sdpa_model(tmp_path / "masked_row.onnx", mask="full", seed=11)
    # The same model with the [B, 1, S, T] mask above in place of the [B, H, S, T] input.
    model = onnx.load(path)
    mask_input = next(i for i in model.graph.input if i.name == "mask")
    mask_input.CopyFrom(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [B, 1, S, T]))
    onnx.save(model, path)
    feed["mask"] = m
    _assert_fused(run_kiln, path, 1)

    args = []
    for name, value in feed.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["-i", f"{name}={tmp_path / f'{name}.npy'}"]
    outs = {}
    for label, flags in (("fused", []), ("unfused", ["--no-optimize"])):
        r = run_kiln("run", path, *args, *flags, "-o", tmp_path / label)
        assert r.returncode == 0, r.describe()
        outs[label] = np.load(tmp_path / label / "y.npy")
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["y"], feed)[0]

    hidden = np.zeros(ref.shape, bool)
    hidden[1, :, 2, :] = True
    assert np.isnan(ref[hidden]).all() and not np.isnan(ref[~hidden]).any()
    assert np.isnan(outs["unfused"][hidden]).all()
    assert (outs["fused"][hidden] == 0).all(), outs["fused"][1, :, 2]
    for label in ("fused", "unfused"):
        np.testing.assert_allclose(outs[label][~hidden], ref[~hidden], rtol=1e-4, atol=1e-4, err_msg=label)


# --- transformers architectures by name (kiln export's hf:TYPE) ---------------------------------

# Tiny configurations of each architecture kiln export names: the graphs are what transformers
# writes for the full-size models (masks, heads, scales, casts), at a size the CPU runs at once.
TINY = "num_hidden_layers=2,hidden_size=32,num_attention_heads=4,intermediate_size=64,vocab_size=97"
HF_ARCHITECTURES = {
    "hf:bert:" + TINY: 2,
    "hf:roberta:" + TINY + ",max_position_embeddings=40,type_vocab_size=1": 2,
    "hf:distilbert:n_layers=2,dim=32,n_heads=4,hidden_dim=64,vocab_size=97": 2,
    "hf:gpt2:n_layer=2,n_embd=32,n_head=4,vocab_size=97": 2,
    "hf:vit:num_hidden_layers=2,hidden_size=32,num_attention_heads=4,intermediate_size=64,image_size=32,patch_size=8": 2,
}


@pytest.mark.parametrize("name", sorted(HF_ARCHITECTURES))
def test_transformers_architectures_fuse_and_match_onnxruntime(name, run_kiln, tmp_path, check_against_onnxruntime):
    """Each attention of a transformers model (eager attention, TorchScript export at opset 17, as
    `kiln export` writes it) is one layer after kiln's passes, and the CPU engine matches ONNX
    Runtime on inputs with padding."""
    import export_model

    spec = export_model.load_model(name, seq_len=12)
    path = str(tmp_path / "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_model.export(spec, path)
    _assert_fused(run_kiln, path, HF_ARCHITECTURES[name])
    check_against_onnxruntime(path, dict(zip(spec.input_names, spec.make_inputs(3, 7))))


def test_dynamic_sequence_fuses_once_for_every_length(run_kiln, tmp_path, check_against_onnxruntime):
    """BERT exported with a dynamic batch and sequence: the mask's shape is shape arithmetic on
    both (learned by probing, at sizes within the model's 40 positions), so the graph kiln keeps
    for every shape has its attentions fused, and it matches ONNX Runtime at several lengths."""
    import export_model

    name = "hf:bert:" + TINY + ",max_position_embeddings=40"
    spec = export_model.load_model(name, seq_len=12, dynamic_sequence=True)
    path = str(tmp_path / "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_model.export(spec, path)
    _assert_fused(run_kiln, path, 2)
    for batch, seq in ((1, 5), (3, 12), (2, 40)):
        check_against_onnxruntime(path, dict(zip(spec.input_names, export_model.input_maker(name, seq_len=seq)(batch))))


# --- real exporters ---------------------------------------------------------------------------

E, HEADS, SEQ = 32, 4, 13  # model width, heads (head size 8), sequence


def _torch_case(case):
    """(module, example inputs as numpy, input names, attention blocks) for an export case."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal([B, SEQ, E]).astype(np.float32)

    class GptBlock(nn.Module):
        """A GPT-2 style decoder block: causal self-attention through scaled_dot_product_attention."""

        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(E), nn.LayerNorm(E)
            self.qkv, self.proj = nn.Linear(E, 3 * E), nn.Linear(E, E)
            self.mlp = nn.Sequential(nn.Linear(E, 4 * E), nn.GELU(), nn.Linear(4 * E, E))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(E, dim=2)
            q, k, v = (a.view(b, t, HEADS, E // HEADS).transpose(1, 2) for a in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, E))
            return x + self.mlp(self.ln2(x))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(GptBlock(), GptBlock())

        def forward(self, x):
            return self.blocks(x)

    class ExplicitLayer(nn.Module):
        """softmax(q @ k^T / sqrt(d) + mask) @ v, written out as BERT-era models do."""

        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(E, E) for _ in range(4))

        def forward(self, x, mask):
            b, t, _ = x.shape
            d = E // HEADS
            q, k, v = (lin(x).view(b, t, HEADS, d).transpose(1, 2) for lin in (self.q, self.k, self.v))
            p = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d) + mask, dim=-1)
            return x + self.o((p @ v).transpose(1, 2).reshape(b, t, E))

    class Explicit(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([ExplicitLayer(), ExplicitLayer()])

        def forward(self, x, attention_mask):
            # The padding mask, once for all layers: [B, T] of 1/0 -> [B, 1, 1, T] of 0/min.
            mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
            for layer in self.layers:
                x = layer(x, mask)
            return x

    class Interleaved(nn.Module):
        """One projection packed per head ([B, T, H, 3, d], as GPT-NeoX packs it), unbound into Q,
        K and V, a padding-free softmax attention, heads merged back."""

        def __init__(self):
            super().__init__()
            self.qkv, self.o = nn.Linear(E, 3 * E), nn.Linear(E, E)

        def forward(self, x):
            b, t, _ = x.shape
            d = E // HEADS
            q, k, v = (a.transpose(1, 2) for a in self.qkv(x).view(b, t, HEADS, 3, d).unbind(3))
            p = torch.softmax((q * d ** -0.5) @ k.transpose(-2, -1), dim=-1)
            return x + self.o((p @ v).transpose(1, 2).reshape(b, t, E))

    class Mha(nn.Module):
        def __init__(self, need_weights):
            super().__init__()
            self.attn, self.need_weights = nn.MultiheadAttention(E, HEADS, batch_first=True), need_weights

        def forward(self, x):
            return self.attn(x, x, x, need_weights=self.need_weights)[0]

    if case == "explicit_padding":
        attention_mask = np.ones([B, SEQ], np.int64)
        attention_mask[1, -4:] = 0
        return Explicit(), {"x": x, "attention_mask": attention_mask}, 2
    if case == "gpt_sdpa_causal":
        return Gpt(), {"x": x}, 2
    if case == "interleaved_heads":
        return Interleaved(), {"x": x}, 1
    return Mha(case == "mha_need_weights"), {"x": x}, 1


@pytest.mark.parametrize("case,dynamo", [("gpt_sdpa_causal", False), ("gpt_sdpa_causal", True),
                                         ("explicit_padding", False), ("mha_need_weights", False),
                                         ("mha_no_weights", False), ("interleaved_heads", False)])
def test_torch_export_fuses_and_matches_onnxruntime(case, dynamo, run_kiln, tmp_path, check_against_onnxruntime):
    path, feed, attentions = _export(case, dynamo, tmp_path)
    exported = [n.op_type for n in onnx.load(path).graph.node]
    assert exported.count("Softmax") == attentions and "Attention" not in exported, exported
    _assert_fused(run_kiln, path, attentions)
    check_against_onnxruntime(path, feed)


@pytest.mark.parametrize("case", ["gpt_sdpa_causal", "interleaved_heads", "mha_no_weights"])
def test_heads_packed_in_one_projection_are_read_in_place(case, run_kiln, tmp_path, check_against_onnxruntime):
    """Q, K and V split from one projection (Split, Gathers of one index, Reshapes through merged
    axes, Transposes) are read where the projection wrote them: kiln::StridedAttention, and none of
    the layers that copied the heads stay; nn.MultiheadAttention's transposes of its [B, S, E] input
    and output to [S, B, E] go too (moved across the projections into the views)."""
    path, feed, attentions = _export(case, False, tmp_path)
    ops = [layer["op"] for layer in _inspect(run_kiln, path)["layers"]]
    assert ops.count("StridedAttention") == attentions, ops
    moves = [op for op in ops if op in ("Transpose", "Gather", "Split", "Slice", "Squeeze", "Unsqueeze")]
    assert moves == [], ops
    check_against_onnxruntime(path, feed)


def _export(case, dynamo, tmp_path):
    """The case exported by torch.onnx at static shapes: (path, feed, attention count)."""
    import torch

    module, feed, attentions = _torch_case(case)
    module.eval()
    path = str(tmp_path / f"{case}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # dynamo at opset 18: from 23 on it writes SDPA as an Attention node itself.
        torch.onnx.export(module, tuple(torch.from_numpy(v) for v in feed.values()), path, dynamo=dynamo,
                          opset_version=18 if dynamo else 17, input_names=list(feed), output_names=["y"])
    return path, feed, attentions


def test_engine_file_with_hostile_attention_views_is_a_clear_error(run_kiln, tmp_path):
    """kiln::StridedAttention exists only in engine files, whose views a forger can set: a view
    reaching past its tensor, strides that write an element of the output twice, or sizes that
    overflow are each refused with the reason (exit 1, the file named), never read out of bounds."""
    from test_engine_files import pack, unpack

    path, feed, _ = _export("mha_no_weights", False, tmp_path)
    engine = tmp_path / "mha.engine"
    r = run_kiln("build", path, "--device", "cpu", "-o", engine)
    assert r.returncode == 0, r.describe()
    header, graph, weights = unpack(engine.read_bytes())

    def forged(name, attr, values):
        model = onnx.ModelProto()
        model.ParseFromString(graph)
        node = next(n for n in model.graph.node if n.op_type == "StridedAttention")
        a = next(a for a in node.attribute if a.name == attr)
        del a.ints[:]
        a.ints.extend(values)
        out = tmp_path / f"{name}.engine"
        out.write_bytes(pack(header, model.SerializeToString(), weights))
        return out

    model = onnx.ModelProto()
    model.ParseFromString(graph)
    node = next(n for n in model.graph.node if n.op_type == "StridedAttention")
    views = {a.name: list(a.ints) for a in node.attribute}
    cases = {
        "offset_past_end": ("q_view", [10 ** 9] + views["q_view"][1:], "q_view reaches outside its source"),
        "negative_stride": ("k_view", views["k_view"][:1] + [-1] + views["k_view"][2:], "k_view reaches outside"),
        "huge_strides": ("v_view", [0, 2 ** 62, 2 ** 62, 2 ** 62], "v_view reaches outside"),
        "overlapping_output": ("y_view", [0, 0, 0, 0], "writes some element of Z twice"),
        "huge_sizes": ("q_shape", [2 ** 41, 1, 1, 1], "sizes from 1 to 2^40"),
        "short_shape": ("k_shape", [1, 2], "k_shape must hold 4 integers"),
    }
    for name, (attr, values, reason) in cases.items():
        bad = forged(name, attr, values)
        r = run_kiln("run", bad, "--random")
        assert r.returncode == 1 and str(bad) in r.stderr and reason in r.stderr, (name, r.describe())
