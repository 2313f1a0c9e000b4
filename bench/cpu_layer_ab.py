#!/usr/bin/env python3
"""Two kiln builds on single convolution layers, CPU engine, alternating rounds.

    .venv/bin/python bench/cpu_layer_ab.py --kiln before=/tmp/kiln_before --kiln after=build/kiln \
        --layer 1280x320x7:SiLU --layer 672x112x14:SiLU --threads 1 --rounds 5 --out F.json

Each --layer COUTxCINxSIZE[:ACTIVATION] is a 1x1 convolution with bias of a 1 x CIN x SIZE x SIZE
input (seeded random weights), followed by the activation as exporters write it (SiLU as
Sigmoid and Mul, HardSwish, Relu, Sigmoid, or none), which kiln fuses into the convolution's
epilogue. Every build builds each layer's engine once; each round then times every (build,
layer) with `kiln bench ENGINE --device cpu --threads T --iterations N`, the builds alternating,
so the machine's drift hits both alike. The JSON has each round's medians and, per layer and
build, the least and largest of them.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import tempfile

import numpy as np


def layer_model(spec: str, path: str) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    shape, _, act = spec.partition(":")
    cout, cin, size = (int(v) for v in shape.split("x"))
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((cout, cin, 1, 1)) / np.sqrt(cin)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32) * 0.1, "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act else "y"])]
    if act == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    elif act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, size, size])], [w, b])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", action="append", required=True, metavar="NAME=PATH", help="a kiln CLI to time (twice or more)")
    ap.add_argument("--layer", action="append", required=True, metavar="COUTxCINxSIZE[:ACTIVATION]")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "kiln_cpu_layer_ab"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    builds = dict(k.split("=", 1) for k in args.kiln)
    os.makedirs(args.work, exist_ok=True)
    engines = {}
    for layer in args.layer:
        model = os.path.join(args.work, layer.replace(":", "_") + ".onnx")
        layer_model(layer, model)
        for name, kiln in builds.items():
            engine = os.path.join(args.work, f"{layer.replace(':', '_')}.{name}.engine")
            subprocess.run([kiln, "build", model, "--device", "cpu", "-o", engine], check=True, capture_output=True)
            engines[layer, name] = engine
    rounds = []
    for r in range(args.rounds):
        row = {}
        for layer in args.layer:
            for name, kiln in builds.items():
                done = subprocess.run([kiln, "bench", engines[layer, name], "--device", "cpu", "--threads", str(args.threads),
                                       "--iterations", str(args.iterations)], check=True, capture_output=True, text=True)
                row[f"{layer} {name}"] = float(re.search(r"median ([0-9.]+) ms", done.stdout + done.stderr).group(1))
                print(f"round {r + 1}/{args.rounds} {layer} {name}: {row[f'{layer} {name}']:.4f} ms", flush=True)
        rounds.append(row)
    summary = {key: {"least_ms": min(r[key] for r in rounds), "largest_ms": max(r[key] for r in rounds)} for key in rounds[0]}
    with open(args.out, "w") as f:
        json.dump({"command": "bench/cpu_layer_ab.py " + " ".join(f"--kiln {k}" for k in args.kiln) + " " +
                   " ".join(f"--layer {l}" for l in args.layer) + f" --threads {args.threads} --iterations {args.iterations} "
                   f"--rounds {args.rounds}", "date": datetime.date.today().isoformat(),
                   "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
                   "rounds": rounds, "summary": summary}, f, indent=1)
    for key, s in summary.items():
        print(f"{key}: {s['least_ms']:.4f}-{s['largest_ms']:.4f} ms")


if __name__ == "__main__":
    main()
