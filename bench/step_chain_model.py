#!/usr/bin/env python3
"""Writes an ONNX model that is a chain of N tiny elementwise steps (Add and Mul of a [1, 16]
float32 tensor by a constant, alternating), whose run time is almost all the engine's own cost
per step: what `bench/cpu_models_ab.py` times it for.

    .venv/bin/python bench/step_chain_model.py --steps 200 --out /tmp/step_chain_200.onnx
"""
import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    one = numpy_helper.from_array(np.ones((1, 16), np.float32), "one")
    nodes, previous = [], "x"
    for i in range(args.steps):
        nodes.append(helper.make_node("Add" if i % 2 == 0 else "Mul", [previous, "one"], [f"v{i}"]))
        previous = f"v{i}"
    graph = helper.make_graph(nodes, "step_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info(previous, TensorProto.FLOAT, None)], [one])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), args.out)


if __name__ == "__main__":
    main()
