"""`kiln export`: a PyTorch model to ONNX with a dynamic batch dimension, checked against PyTorch.

    kiln export resnet18 -o resnet18.onnx
    kiln export resnet50 --exporter dynamo --size 224 -o r50.onnx
    kiln export mypkg.models:make_net --channels 1 --size 28 -o net.onnx
    kiln export resnet18 --simplify -o resnet18.onnx      # also write the graph after kiln's folding
    kiln export --from savedmodel DIR -o model.onnx         # a TensorFlow SavedModel, through tf2onnx

MODEL is a torchvision classification model name (random weights: nothing is downloaded), one of
kiln's small test models, a transformer by name (bert_base, bert_large, roberta_base,
distilbert_base, gpt2: HuggingFace transformers' architecture from its configuration, random
weights), any transformers architecture as hf:TYPE[:KEY=VALUE,...] (e.g.
hf:bert:num_hidden_layers=4,hidden_size=256; see --list), or "module:function" returning a
torch.nn.Module that takes one float32 NCHW image batch. Text models take input_ids and
attention_mask of --seq-len tokens (the batch is dynamic; --dynamic-sequence makes the sequence
dynamic too) and output the last hidden state.

    kiln export bert_base --seq-len 128 -o bert_base.onnx
    kiln export hf:roberta:num_hidden_layers=2 --dynamic-sequence -o roberta.onnx

The exported file is run with ONNX Runtime (CPU) and compared with PyTorch (or TensorFlow); the
relative L2 error of each output is printed, and the exit code is 1 past 1e-4. With --simplify
the model is then rewritten after kiln's folding passes (constants, BatchNorm, shape arithmetic;
no fusion) and checked the same way. The end-to-end tests (tests/e2e) import this file (through
scripts/export_model.py), so what they test is exactly what `kiln export` produces.

This module imports only numpy at load time: torch, onnxruntime, tensorflow and kiln's
extension module are imported where needed.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

# Exporters this script knows. "torchscript" is torch.onnx.export(dynamo=False), the tracing
# exporter most deployed models were made with; "dynamo" is the torch.export based exporter,
# the default of recent PyTorch releases.
EXPORTERS = ("torchscript", "dynamo")

# Models the test suite uses that are not plain torchvision constructors, sized so they export
# and run quickly on two CPU cores. Each maps to a function below.
SMALL_MODELS = {
    "vit_b_16_2layers": "ViT-B/16 width (768, 12 heads, MLP 3072) with 2 layers, for 64x64 images",
    "bert_base_2layers": "BERT-base encoder (hidden 768, 12 heads) with 2 layers; inputs input_ids, attention_mask (seq 16)",
}


# Transformer architectures by name: (transformers model type, configuration overrides, what it is).
# The configurations are transformers' defaults for the type (BERT's is BERT-base) plus the
# overrides: nothing is downloaded, the weights are random.
TRANSFORMERS = {
    "bert_base": ("bert", {}, "BERT-base (12 layers, hidden 768, 12 heads), text"),
    "bert_large": ("bert", {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                            "intermediate_size": 4096}, "BERT-large (24 layers, hidden 1024, 16 heads), text"),
    "roberta_base": ("roberta", {"max_position_embeddings": 514, "type_vocab_size": 1},
                     "RoBERTa-base (12 layers, hidden 768, 12 heads), text"),
    "distilbert_base": ("distilbert", {}, "DistilBERT-base (6 layers, hidden 768, 12 heads), text"),
    "gpt2": ("gpt2", {}, "GPT-2 small (12 layers, hidden 768, 12 heads, causal attention), text"),
}


@dataclass
class ModelSpec:
    """A model ready to export: the module, example inputs, names and which axes are dynamic."""

    name: str
    module: object  # torch.nn.Module
    input_names: list[str]
    output_names: list[str]
    # make_inputs(batch) -> list of numpy arrays, one per input name, deterministic.
    make_inputs: object
    # Per input: the axes that are dynamic ({0: "batch"} for every model here).
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)


def _image_inputs(channels: int, size: int):
    def make(batch: int, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed + batch)
        return [rng.standard_normal((batch, channels, size, size)).astype(np.float32)]

    return make


def _vit_b_16_2layers():
    import torchvision

    import torch

    model = torchvision.models.VisionTransformer(
        image_size=64, patch_size=16, num_layers=2, num_heads=12, hidden_dim=768, mlp_dim=3072)
    # torchvision zero-initialises the classifier head, which would make every output 0 and
    # any comparison of outputs pass trivially.
    torch.nn.init.normal_(model.heads.head.weight, std=0.05)
    return model


def _bert_base_2layers():
    import torch
    from transformers import BertConfig, BertModel

    # Eager attention: the exported graph is then plain MatMul/Softmax, the same under both
    # exporters, rather than a fused scaled_dot_product_attention whose export varies by version.
    config = BertConfig(num_hidden_layers=2, vocab_size=BERT_VOCAB_SIZE, attn_implementation="eager")
    bert = BertModel(config)

    # Positional tensors in, a plain tuple out: both exporters handle that, whereas the
    # HuggingFace output dataclass is awkward to trace.
    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
            return out.last_hidden_state, out.pooler_output

    return Wrapper(bert)


def _parse_hf_name(name: str) -> tuple[str, dict]:
    """"hf:bert:num_hidden_layers=4,hidden_size=256" -> ("bert", {"num_hidden_layers": 4, ...});
    a preset name of TRANSFORMERS -> its type and overrides."""
    if name in TRANSFORMERS:
        model_type, overrides, _ = TRANSFORMERS[name]
        return model_type, dict(overrides)
    parts = name.split(":", 2)
    if len(parts) < 2 or parts[0] != "hf" or not parts[1]:
        raise SystemExit(f"export_model: {name!r} is not of the form hf:TYPE[:KEY=VALUE,...]")
    overrides = {}
    for item in (parts[2].split(",") if len(parts) == 3 and parts[2] else []):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"export_model: {name!r}: {item!r} is not KEY=VALUE")
        for convert in (int, float):
            try:
                overrides[key] = convert(value)
                break
            except ValueError:
                pass
        else:
            overrides[key] = {"true": True, "false": False}.get(value.lower(), value)
    return parts[1], overrides


def is_transformer(name: str) -> bool:
    return name in TRANSFORMERS or name.startswith("hf:")


def _hf_config(name: str):
    from transformers import AutoConfig

    model_type, overrides = _parse_hf_name(name)
    try:
        config = AutoConfig.for_model(model_type, **overrides)
    except ValueError as e:
        raise SystemExit(f"export_model: {name!r}: transformers has no model type {model_type!r} ({e})")
    # Eager attention: the exported graph is plain MatMul/Softmax, the same under both exporters
    # and across transformers versions, rather than a fused scaled_dot_product_attention.
    config._attn_implementation = "eager"
    return config


def _hf_is_text(config) -> bool:
    return getattr(config, "vocab_size", None) is not None


def _hf_module(config):
    import torch
    from transformers import AutoModel

    model = AutoModel.from_config(config, attn_implementation="eager")
    text = _hf_is_text(config)
    # No key/value cache outputs: the graph computes the hidden states only.
    extra = {"use_cache": False} if hasattr(config, "use_cache") else {}

    class TextWrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **extra).last_hidden_state

    class ImageWrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values):
            return self.inner(pixel_values=pixel_values, return_dict=True).last_hidden_state

    return (TextWrapper if text else ImageWrapper)(model)


def _text_inputs(vocab_size: int, seq_len: int):
    def make(batch: int, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed + batch)
        ids = rng.integers(0, vocab_size, size=(batch, seq_len), dtype=np.int64)
        # Padding at the end of each row (a different amount per row), so the attention mask
        # really masks something and rows differ.
        mask = np.ones((batch, seq_len), dtype=np.int64)
        for b in range(batch):
            mask[b, seq_len - 1 - (3 * b + 4) % (seq_len - 1):] = 0
        return [ids, mask]

    return make


BERT_VOCAB_SIZE = 30522  # BertConfig's default


def input_maker(name: str, size: int = 64, channels: int = 3, seq_len: int = 16):
    """make(batch, seed=0) -> the model's inputs as numpy arrays, deterministic. Needs no torch,
    so a test with a cached export does not have to build the model."""
    if name == "bert_base_2layers":
        return _text_inputs(BERT_VOCAB_SIZE, seq_len)
    if is_transformer(name):
        config = _hf_config(name)
        if _hf_is_text(config):
            return _text_inputs(config.vocab_size, seq_len)
        return _image_inputs(config.num_channels, config.image_size)
    return _image_inputs(channels, 64 if name == "vit_b_16_2layers" else size)


# Changes whenever load_model builds different weights, so caches of exports are not reused:
# 2 = BatchNorm statistics calibrated (see _calibrate_batchnorm); 3 = no all-zero Linear weights.
WEIGHTS_VERSION = 3


def load_model(name: str, size: int = 64, channels: int = 3, seq_len: int = 16, seed: int = 0,
               dynamic_sequence: bool = False) -> ModelSpec:
    """Builds MODEL with random weights (seeded), in eval mode, ready to export. Text models take
    seq_len tokens; dynamic_sequence makes their sequence axis dynamic in the export."""
    import torch

    torch.manual_seed(seed)
    if is_transformer(name):
        config = _hf_config(name)
        module = _hf_module(config)
        make = input_maker(name, seq_len=seq_len)
        if _hf_is_text(config):
            names = ["input_ids", "attention_mask"]
            limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
            if limit and seq_len > limit - (2 if config.model_type == "roberta" else 0):
                raise SystemExit(f"export_model: {name}: --seq-len {seq_len} is past the model's "
                                 f"{limit} positions")
            axes = {0: "batch", 1: "sequence"} if dynamic_sequence else {0: "batch"}
        else:
            names = ["pixel_values"]
            axes = {0: "batch"}
        return ModelSpec(name, module.eval(), names, ["last_hidden_state"], make,
                         {n: dict(axes) for n in names + ["last_hidden_state"]})
    if name == "bert_base_2layers":
        module = _bert_base_2layers()
        make = input_maker(name, seq_len=seq_len)
        names = ["input_ids", "attention_mask"]
        outputs = ["last_hidden_state", "pooler_output"]
        axes = {n: {0: "batch"} for n in names + outputs}
        return ModelSpec(name, module.eval(), names, outputs, make, axes)
    if name == "vit_b_16_2layers":
        module = _vit_b_16_2layers()
        size = 64
    elif ":" in name:
        mod_name, fn_name = name.split(":", 1)
        module = getattr(importlib.import_module(mod_name), fn_name)()
    else:
        import torchvision

        if name not in torchvision.models.list_models(module=torchvision.models):
            raise SystemExit(f"export_model: unknown model '{name}': not a torchvision classification "
                             f"model, not one of {sorted(SMALL_MODELS)}, and not module:function")
        module = torchvision.models.get_model(name, weights=None)
        # torchvision zero-initialises some classifier heads (ViT's): every output would be 0 and
        # any comparison of outputs would pass trivially. Random weights are random everywhere.
        for m in module.modules():
            if isinstance(m, torch.nn.Linear) and not m.weight.any():
                torch.nn.init.normal_(m.weight, std=0.05)
    axes = {"input": {0: "batch"}, "output": {0: "batch"}}
    make = input_maker(name, size, channels)
    _calibrate_batchnorm(module, make)
    return ModelSpec(name, module.eval(), ["input"], ["output"], make, axes)


def _calibrate_batchnorm(module, make, batches: int = 4, batch: int = 8) -> None:
    """Sets every BatchNorm's running statistics from a few random batches, as training would.
    With the initial statistics (mean 0, variance 1) a randomly initialised network's
    activations shrink layer by layer: MobileNet-v2's last layers output values near 1e-8,
    below float16's smallest subnormal, so no float16 engine (ours, PyTorch's) could match
    float32 on such a model. Trained networks keep activations near unit scale; so do these."""
    import torch

    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None  # a cumulative average over the batches
    module.train()
    with torch.no_grad():
        for i in range(batches):
            module(*(torch.from_numpy(a) for a in make(batch, seed=1000 + i)))
    module.eval()


def export(spec: ModelSpec, path: str, exporter: str = "torchscript", opset: int | None = 17) -> None:
    """Exports spec to path with a dynamic batch. Writes to a temporary name first, so a
    crashed or interrupted export never leaves a half-written file that a cache would trust."""
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, not {exporter!r}")
    tmp = f"{path}.tmp{os.getpid()}"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        _export_to(spec, tmp, exporter, opset)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _export_to(spec: ModelSpec, tmp: str, exporter: str, opset: int | None) -> None:
    import torch

    # Batch 2 for the example: torch.export specialises dimensions whose example size is 1.
    # Not under torch.no_grad(): without gradients nn.MultiheadAttention takes a "fast path"
    # (aten::_native_multi_head_attention) that the TorchScript exporter cannot export.
    args = tuple(torch.from_numpy(a) for a in spec.make_inputs(2))
    if exporter == "torchscript":
        torch.onnx.export(spec.module, args, tmp, dynamo=False, opset_version=opset or 17,
                          input_names=spec.input_names, output_names=spec.output_names,
                          dynamic_axes=spec.dynamic_axes)
    else:
        dims = {"batch": torch.export.Dim("batch", min=1, max=1024), "sequence": torch.export.Dim("sequence", min=2, max=4096)}
        dynamic_shapes = {param: {axis: dims[d] for axis, d in spec.dynamic_axes.get(name, {0: "batch"}).items()}
                          for param, name in zip(_forward_arg_names(spec), spec.input_names)}
        kwargs = {} if opset is None else {"opset_version": opset}
        program = torch.onnx.export(spec.module, args, dynamo=True, dynamic_shapes=dynamic_shapes,
                                    input_names=spec.input_names, output_names=spec.output_names,
                                    **kwargs)
        # One self-contained file (models here are < 2 GB): kiln and the cache handle one path.
        program.save(tmp, external_data=False)


def _forward_arg_names(spec: ModelSpec) -> list[str]:
    """torch.export wants dynamic_shapes keyed by forward()'s own parameter names."""
    import inspect

    params = list(inspect.signature(spec.module.forward).parameters)
    return params[: len(spec.input_names)]


def run_torch(spec: ModelSpec, inputs: list[np.ndarray]) -> list[np.ndarray]:
    import torch

    with torch.no_grad():
        out = spec.module(*[torch.from_numpy(a) for a in inputs])
    if not isinstance(out, (tuple, list)):
        out = (out,)
    return [o.detach().numpy() for o in out]


def run_ort(path: str, feeds: dict[str, np.ndarray], threads: int = 2) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def relative_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    """||actual - expected|| / ||expected||, in float64; 0 when both are all zeros."""
    a = np.asarray(actual, dtype=np.float64).ravel()
    e = np.asarray(expected, dtype=np.float64).ravel()
    denom = np.linalg.norm(e)
    num = np.linalg.norm(a - e)
    if denom == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return float(num / denom)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="torchvision model name, a kiln test model, or module:function")
    p.add_argument("-o", "--output", help="ONNX file to write (default: MODEL-EXPORTER.onnx)")
    p.add_argument("--exporter", choices=EXPORTERS, default="torchscript")
    p.add_argument("--opset", type=int, default=None,
                   help="ONNX opset (default: 17 for torchscript, the exporter's own default for dynamo)")
    p.add_argument("--size", type=int, default=224, help="image height and width of the check input (default 224)")
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--batch", type=int, default=2, help="batch size of the check input (the export is dynamic)")
    p.add_argument("--seq-len", type=int, default=128, help="text models: tokens per input (default 128)")
    p.add_argument("--dynamic-sequence", action="store_true", help="text models: export the sequence axis dynamic too")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    p.add_argument("--list", action="store_true", help="list the known model names and exit")
    p.add_argument("--simplify", action="store_true",
                   help="write the graph after kiln's folding passes (constants, BatchNorm, shape arithmetic) "
                        "instead of the exporter's, checked the same way")
    p.add_argument("--from", dest="source", choices=("pytorch", "savedmodel"), default="pytorch",
                   help="savedmodel: MODEL is a TensorFlow SavedModel folder, converted with tf2onnx")
    a = p.parse_args(argv)
    if a.source == "savedmodel":
        if not a.model:
            p.error("--from savedmodel needs the SavedModel folder as MODEL")
        return export_savedmodel(a.model, a.output or "model.onnx", a.opset or 17, a.batch, a.seed, a.simplify)

    if a.list:
        import torchvision

        for n in SMALL_MODELS:
            print(f"{n:<22} {SMALL_MODELS[n]}")
        for n, (_, _, what) in TRANSFORMERS.items():
            print(f"{n:<22} {what}")
        print(f"{'hf:TYPE[:KEY=VALUE,...]':<22} any transformers architecture from its default configuration")
        print("torchvision:", " ".join(torchvision.models.list_models(module=torchvision.models)))
        return 0
    if not a.model:
        p.error("MODEL is required (or --list)")
    opset = a.opset if a.opset is not None else (17 if a.exporter == "torchscript" else None)
    out = a.output or f"{a.model.replace(':', '_')}-{a.exporter}.onnx"

    spec = load_model(a.model, size=a.size, channels=a.channels, seq_len=a.seq_len, seed=a.seed,
                      dynamic_sequence=a.dynamic_sequence)
    t0 = time.perf_counter()
    export(spec, out, a.exporter, opset)
    print(f"exported {a.model} with the {a.exporter} exporter to {out} "
          f"({os.path.getsize(out) / 1e6:.1f} MB, {time.perf_counter() - t0:.1f} s)")

    inputs = spec.make_inputs(a.batch, a.seed)
    expected = run_torch(spec, inputs)
    if a.simplify:
        simplify_in_place(out)
    return check_outputs(out, dict(zip(spec.input_names, inputs)), expected, spec.output_names, "PyTorch")


def check_outputs(path: str, feeds: dict[str, np.ndarray], expected: list[np.ndarray], names: list[str],
                  reference: str) -> int:
    """Prints ONNX Runtime's error against the reference per output; 1 when one is past 1e-4."""
    actual = run_ort(path, feeds)
    worst = 0.0
    for name, e, o in zip(names, expected, actual):
        err = relative_l2(o, e)
        worst = max(worst, err)
        print(f"  {name}: shape {list(o.shape)}, ONNX Runtime vs {reference} relative L2 error {err:.2e}, "
              f"max abs diff {np.max(np.abs(o.astype(np.float64) - e)):.2e}")
    if worst > 1e-4:
        print(f"kiln export: warning: ONNX Runtime differs from {reference} by {worst:.2e} (> 1e-4)", file=sys.stderr)
        return 1
    return 0


def simplify_in_place(path: str) -> None:
    """Rewrites the ONNX file after kiln's folding passes (kiln's extension module)."""
    try:
        from kiln import _kiln
    except ImportError as e:
        raise SystemExit(f"kiln export: --simplify needs kiln's extension module (pip install . in kiln's "
                         f"source folder): {e}")
    tmp = f"{path}.simplified{os.getpid()}"
    try:
        before, after = _kiln.simplify_onnx(path, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print(f"simplified with kiln's folding passes: {before} nodes -> {after}, {os.path.getsize(path) / 1e6:.1f} MB")


def export_savedmodel(folder: str, out: str, opset: int, batch: int, seed: int, simplify: bool) -> int:
    """A TensorFlow SavedModel (e.g. Keras model.export(folder)) to ONNX through tf2onnx, with the
    batch dimension dynamic, checked against TensorFlow on random inputs."""
    try:
        import tensorflow as tf
        import tf2onnx  # noqa: F401  (checked here, so a missing package is one clear message)
    except ImportError as e:
        raise SystemExit(f"kiln export: --from savedmodel needs tensorflow and tf2onnx (pip install tensorflow-cpu "
                         f"tf2onnx): {e}")
    import subprocess

    if not os.path.isdir(folder):
        raise SystemExit(f"kiln export: {folder}: not a SavedModel folder")
    loaded = tf.saved_model.load(folder)
    fn = loaded.signatures.get("serving_default")
    if fn is None:
        raise SystemExit(f"kiln export: {folder} has no serving_default signature")
    specs = fn.structured_input_signature[1]
    t0 = time.perf_counter()
    tmp = f"{out}.tmp{os.getpid()}"
    r = subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--saved-model", folder, "--output", tmp,
                        "--opset", str(opset)], capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(tmp):
        print(r.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"kiln export: tf2onnx could not convert {folder} (exit code {r.returncode})")
    os.replace(tmp, out)
    print(f"exported the SavedModel {folder} with tf2onnx to {out} ({os.path.getsize(out) / 1e6:.1f} MB, "
          f"{time.perf_counter() - t0:.1f} s)")
    rng = np.random.default_rng(seed)
    feeds, tf_inputs = {}, {}
    for key, spec in specs.items():
        shape = [batch if d is None else d for d in spec.shape.as_list()]
        x = rng.standard_normal(shape).astype(spec.dtype.as_numpy_dtype)
        tf_inputs[key] = tf.constant(x)
        feeds[key] = x
    outputs = fn(**tf_inputs)
    names = sorted(outputs)
    expected = [outputs[n].numpy() for n in names]
    if simplify:
        simplify_in_place(out)
    # tf2onnx names the ONNX inputs and outputs after the signature's; ONNX Runtime returns the
    # model's outputs in the model's order, which follows the signature's sorted keys.
    import onnx

    model = onnx.load(out)
    onnx_inputs = [i.name for i in model.graph.input]
    feeds = {n: feeds[k] for n, k in zip(onnx_inputs, sorted(feeds))}
    return check_outputs(out, feeds, expected, names, "TensorFlow")


if __name__ == "__main__":
    sys.exit(main())
