"""torch.compile(model, backend="kiln") on the CPU engine: outputs against eager PyTorch on a
torchvision CNN and a BERT encoder (random weights), an engine per input shape and the cache,
and graphs kiln refuses left to eager PyTorch with a warning. The GPU path (fp16 engines on
torch's stream) is tests/gpu's."""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln.torch_backend as kiln_torch


def _compiled(model: torch.nn.Module, *args, **kwargs):
    torch._dynamo.reset()
    with torch.no_grad():
        return torch.compile(model, backend="kiln")(*args, **kwargs), model(*args, **kwargs)


def test_the_backend_is_registered_by_name():
    assert "kiln" in torch._dynamo.list_backends()


def test_the_packages_entry_point_names_the_backend():
    # pip's install declares the backend to torch by this entry point (pyproject.toml).
    import importlib
    import pathlib
    import tomllib

    pyproject = tomllib.loads((pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["torch_dynamo_backends"]["kiln"]
    module, attribute = target.split(":")
    assert getattr(importlib.import_module(module), attribute) is kiln_torch.kiln_backend


def test_a_cnn_runs_as_one_engine_and_matches_eager():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    before = kiln_torch.stats["engines"]
    got, want = _compiled(model, torch.randn(2, 3, 64, 64))
    assert kiln_torch.stats["engines"] == before + 1
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_bert_encoder_with_a_padding_mask_matches_eager():
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                     vocab_size=1000, max_position_embeddings=64)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 1000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 10:] = 0
    before = dict(kiln_torch.stats)
    got, want = _compiled(model, input_ids=ids, attention_mask=mask)
    assert kiln_torch.stats["engines"] == before.get("engines", 0) + 1
    assert kiln_torch.stats["eager"] == before.get("eager", 0)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-4)


def test_each_shape_builds_once_and_then_comes_from_the_cache():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    torch._dynamo.reset()
    torch._dynamo.config.automatic_dynamic_shapes = False  # a graph per shape, as a fixed-shape engine wants
    try:
        fast = torch.compile(model, backend="kiln")
        before = dict(kiln_torch.stats)
        with torch.no_grad():
            for batch in (3, 5, 3):
                x = torch.randn(batch, 8)
                torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
        assert kiln_torch.stats["engines"] == before.get("engines", 0) + 2
        torch._dynamo.reset()  # compiled again from scratch: the engines come from kiln's cache
        with torch.no_grad():
            x = torch.randn(5, 8)
            torch.testing.assert_close(torch.compile(model, backend="kiln")(x), model(x), rtol=1e-5, atol=1e-5)
        assert kiln_torch.stats["engines"] == before.get("engines", 0) + 2
        assert kiln_torch.stats["cached"] > before.get("cached", 0)
    finally:
        torch._dynamo.config.automatic_dynamic_shapes = True


class _Bernoulli(torch.nn.Module):
    """Bernoulli of probabilities 0 and 1: an op kiln refuses, with an outcome that is certain."""

    def forward(self, a):
        return torch.bernoulli((a > 0).float()) + 1


def test_a_graph_kiln_refuses_runs_in_eager_with_a_warning():
    a = torch.randn(3, 3)
    before = kiln_torch.stats["eager"]
    with pytest.warns(UserWarning, match="eager PyTorch: kiln refuses it: .*Bernoulli"):
        got, want = _compiled(_Bernoulli(), a)
    assert kiln_torch.stats["eager"] == before + 1
    torch.testing.assert_close(got, want)
