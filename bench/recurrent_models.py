"""Recurrent models as PyTorch writes them, for the CPU benches (bench/cpu_models_ab.py): a speech
encoder's bidirectional two-layer LSTM over 200 frames of 80 features, a GRU tagger over a batch
of 8 sequences of 100 tokens, and a one-layer Elman RNN; random weights (seed 0), exported with
torch.onnx to OUT/<name>.onnx.

    .venv/bin/python bench/recurrent_models.py --out DIR
"""
from __future__ import annotations

import argparse
import os


def models():
    """name -> (module, example input [batch, seq, features])."""
    import torch
    from torch import nn

    class Recurrent(nn.Module):
        def __init__(self, cell: nn.Module):
            super().__init__()
            self.cell = cell

        def forward(self, x):
            return self.cell(x)[0]

    torch.manual_seed(0)
    return {
        "lstm_speech": (Recurrent(nn.LSTM(80, 256, num_layers=2, bidirectional=True, batch_first=True)), torch.randn(1, 200, 80)),
        "gru_tagger": (Recurrent(nn.GRU(128, 256, batch_first=True)), torch.randn(8, 100, 128)),
        "rnn_elman": (Recurrent(nn.RNN(64, 128, batch_first=True)), torch.randn(4, 200, 64)),
    }


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for the .onnx files")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name, (module, x) in models().items():
        path = os.path.join(args.out, name + ".onnx")
        with torch.no_grad():
            torch.onnx.export(module.eval(), (x,), path, input_names=["x"], output_names=["y"], opset_version=17, dynamo=False)
        print(path)


if __name__ == "__main__":
    main()
