#!/usr/bin/env python3
"""kiln's CPU engine against ONNX Runtime layer by layer: each convolution of a model, alone.

    .venv/bin/python bench/cpu_layer_compare.py --model mobilenet_v2 --threads 1 \
        --out bench/results/cpu_layers_mobilenet_v2.json

Why: a whole-model comparison (bench/cpu_compare.py) says how far behind kiln is, not where, and
ONNX Runtime's own node profile overstates its nodes (tens of microseconds each;
docs/design/cpu-gemm.md). Here every Conv of the model becomes a model of its own, with what
both engines fuse into it (a following Add of another activation, then Relu or Clip), its
inputs fixed at the shapes the layer sees in the whole model, and both engines time that model
alone, in alternating rounds, in processes of their own; the outputs of the same inputs are
compared. Each side times its engine and nothing around it: kiln's through `kiln bench
--exportTimes` (C++, inputs made once, no Python call around each run),
ONNX Runtime's through IO binding with the inputs and a preallocated output bound once (a fresh
output costs a page fault every 4 KB). Each engine's cost of one call on a tiny model (a Relu of
one float) is measured the same way and reported beside the layers, since every layer's time
includes it.

What a layer's ONNX Runtime time holds: ONNX Runtime runs convolutions in its blocked NCHWc
layout, so an isolated layer runs ReorderInput, the NCHWc Conv and ReorderOutput, where the
whole model reorders once at each end. Its layers here are slower than in the whole model, and
the sum of the layers is no whole-model comparison (docs/design/cpu-gemm.md, "Layer by layer,
each engine alone").

--model takes a torchvision model name (seeded random weights, as bench/cpu_compare.py exports
them) or --onnx a model file. The JSON has a row per layer: its nodes, shapes, kiln_ms, ort_ms
(medians over the rounds) and the largest output difference.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu_compare  # noqa: E402  (export, run_record)
import cpu_resnet50  # noqa: E402  (stats, kiln_commit, machine)

FUSED_ACTIVATIONS = {"Relu", "Clip"}

WORKER = r"""
import json, os, subprocess, sys, tempfile, time
import numpy as np
kind, plan_path, threads, runs, warmup, kiln_cli = sys.argv[1:7]
plan = json.load(open(plan_path))
if kind == "kiln":
    import kiln
    kiln.set_cpu_threads(int(threads))
else:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
result = []
for layer in plan:
    feeds = dict(np.load(layer["inputs"]))
    if kind == "kiln":
        # The engine alone: `kiln bench` runs it from C++ on inputs it made once (no Python call
        # around each run); the output to compare comes from one run here.
        with tempfile.TemporaryDirectory() as tmp:
            times_path = os.path.join(tmp, "times.json")
            subprocess.run([kiln_cli, "bench", layer["engine"], "--device", "cpu", "--threads", threads, "--iterations", runs,
                            "--warmup", warmup, "--exportTimes", times_path], check=True, capture_output=True)
            times = json.load(open(times_path))[0]["times_ms"]
        out = next(iter(kiln.Engine.load(layer["engine"]).run(feeds).values()))
    else:
        # The session alone: inputs and the output bound once (IO binding), so that a run
        # allocates nothing (a fresh output costs a page fault every 4 KB).
        session = ort.InferenceSession(layer["onnx"], so, providers=["CPUExecutionProvider"])
        binding = session.io_binding()
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value))
        expected = session.run(None, feeds)[0]
        out = np.empty_like(expected)
        binding.bind_ortvalue_output(session.get_outputs()[0].name, ort.OrtValue.ortvalue_from_numpy(out))
        for _ in range(int(warmup)):
            session.run_with_iobinding(binding)
        times = []
        for _ in range(int(runs)):
            t0 = time.perf_counter()
            session.run_with_iobinding(binding)
            times.append((time.perf_counter() - t0) * 1e3)
    np.save(layer["output_" + kind], np.asarray(out, dtype=np.float32))
    result.append(times)
print(json.dumps(result))
"""


def layer_chains(graph, consumers, constant):
    """Each Conv with the nodes both engines fuse after it: an Add of one other activation, then
    Relu or Clip, each the single consumer of the value before it."""
    chains = []
    for node in graph.node:
        if node.op_type != "Conv":
            continue
        chain = [node]
        for allowed in ({"Add"}, FUSED_ACTIVATIONS):
            users = consumers.get(chain[-1].output[0], [])
            if len(users) != 1 or users[0].op_type not in allowed:
                continue
            nxt = users[0]
            if nxt.op_type == "Add" and sum(1 for i in nxt.input if i not in constant) != 2:
                continue
            chain.append(nxt)
        chains.append(chain)
    return chains


def layer_model(chain, shapes, initializers, opset):
    """A model of one chain: its activations as inputs, its constants as initializers."""
    import onnx
    from onnx import helper

    produced = {o for n in chain for o in n.output}
    inputs, inits, seen = [], [], set()
    for n in chain:
        for name in n.input:
            if not name or name in produced or name in seen:
                continue
            seen.add(name)
            if name in initializers:
                inits.append(initializers[name])
            else:
                inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shapes[name]))
    out = chain[-1].output[0]
    graph = helper.make_graph(list(chain), "layer", inputs,
                              [helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, shapes[out])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def describe(chain, shapes, initializers):
    conv = chain[0]
    attrs = {a.name: list(a.ints) if a.ints else a.i for a in conv.attribute}
    w = initializers[conv.input[1]].dims
    x, y = shapes[conv.input[0]], shapes[conv.output[0]]
    group = attrs.get("group", 1)
    kind = "dw" if group > 1 and group == x[1] else ("g%d" % group if group > 1 else "")
    k = "x".join(str(d) for d in w[2:])
    s = attrs.get("strides", [1])[0]
    extra = "+".join(n.op_type for n in chain[1:])
    return (f"{k}{' ' + kind if kind else ''} s{s} {x[1]}->{y[1]} at {x[2]}x{x[3]}->{y[2]}x{y[3]}"
            + (f" +{extra}" if extra else ""))


def tiny_model(path):
    import onnx
    from onnx import helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a torchvision model name (seeded random weights)")
    src.add_argument("--onnx", help="an ONNX model file")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--image-size", type=int, default=224, help="height and width of the model's input (--model)")
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "build", "kiln"), help="the kiln CLI")
    ap.add_argument("--kiln-python", default=os.path.join(HERE, "..", "build", "python"),
                    help="folder holding kiln's Python module")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=30, help="timed runs per layer per engine per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "kiln_cpu_layer_compare"))
    ap.add_argument("--out", help="JSON to write")
    args = ap.parse_args()

    import onnx
    from onnx import numpy_helper, shape_inference

    os.makedirs(args.work, exist_ok=True)
    if args.model:
        onnx_path = os.path.join(args.work, f"{args.model}.onnx")
        if not os.path.exists(onnx_path):
            print(f"exporting {args.model}", flush=True)
            cpu_compare.export(args.model, onnx_path)
    else:
        onnx_path = os.path.abspath(args.onnx)
    model = onnx.load(onnx_path)
    graph_inputs = {i.name for i in model.graph.initializer}
    for value in model.graph.input:
        if value.name in graph_inputs:
            continue
        dims = value.type.tensor_type.shape.dim
        for i, d in enumerate(dims):
            if not d.HasField("dim_value"):
                d.dim_value = args.batch if i == 0 else args.image_size
    model = shape_inference.infer_shapes(model)
    shapes = {}
    for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        dims = v.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[v.name] = [d.dim_value for d in dims]
    initializers = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:  # Constant nodes (Clip's bounds) as initializers
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            initializers[n.output[0]] = numpy_helper.from_array(numpy_helper.to_array(n.attribute[0].t),
                                                                n.output[0])
    consumers = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    chains = layer_chains(model.graph, consumers, set(initializers))

    kiln = os.path.abspath(args.kiln)
    rng = np.random.default_rng(0)
    plan = []
    tiny = os.path.join(args.work, "tiny.onnx")
    tiny_model(tiny)
    entries = [("call overhead (Relu of one float)", tiny, {"x": np.ones((1, 1), np.float32)})]
    for index, chain in enumerate(chains):
        path = os.path.join(args.work, f"layer{index:03d}.onnx")
        m = layer_model(chain, shapes, initializers, opset)
        onnx.save(m, path)
        feeds = {i.name: rng.standard_normal(shapes[i.name], dtype=np.float32) for i in m.graph.input}
        entries.append((describe(chain, shapes, initializers), path, feeds))
    for index, (label, path, feeds) in enumerate(entries):
        engine = path[:-len(".onnx")] + ".cpu.engine"
        r = subprocess.run([kiln, "build", path, "--device", "cpu", "-o", engine], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"kiln build {path} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        inputs = path[:-len(".onnx")] + "_inputs.npz"
        np.savez(inputs, **feeds)
        base = path[:-len(".onnx")]
        plan.append({"label": label, "onnx": path, "engine": engine, "inputs": inputs,
                     "output_kiln": base + "_kiln.npy", "output_ort": base + "_ort.npy"})
        print(f"\rbuilt {index + 1}/{len(entries)} layer engines", end="", flush=True)
    print(flush=True)
    plan_path = os.path.join(args.work, "plan.json")
    with open(plan_path, "w") as f:
        json.dump(plan, f)

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in [os.path.abspath(args.kiln_python), os.environ.get("PYTHONPATH")] if p))
    load_before = os.getloadavg()
    times = {"kiln": [[] for _ in plan], "ort": [[] for _ in plan]}
    for round_index in range(args.rounds):
        for kind in ("kiln", "ort") if round_index % 2 == 0 else ("ort", "kiln"):
            r = subprocess.run([sys.executable, "-c", WORKER, kind, plan_path, str(args.threads), str(args.runs),
                                str(args.warmup), kiln], capture_output=True, text=True, env=env)
            if r.returncode != 0:
                raise SystemExit(f"{kind} worker failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
            for i, t in enumerate(json.loads(r.stdout.strip().splitlines()[-1])):
                times[kind][i] += t
            print(f"round {round_index + 1}/{args.rounds} {kind} done", flush=True)

    rows = []
    for i, layer in enumerate(plan):
        k, o = cpu_resnet50.stats(times["kiln"][i]), cpu_resnet50.stats(times["ort"][i])
        y_kiln, y_ort = np.load(layer["output_kiln"]), np.load(layer["output_ort"])
        rows.append({"layer": layer["label"], "kiln_ms": k["median_ms"], "ort_ms": o["median_ms"],
                     "kiln_over_ort": k["median_ms"] / o["median_ms"], "kiln_min_ms": k["min_ms"],
                     "ort_min_ms": o["min_ms"],
                     "max_abs_diff": float(np.max(np.abs(y_kiln.reshape(y_ort.shape) - y_ort)))})
    overhead, layers = rows[0], rows[1:]
    width = max(len(r["layer"]) for r in rows)
    print(f"{'layer':{width}}  kiln ms   ORT ms  kiln/ORT  max diff")
    for r in rows:
        print(f"{r['layer']:{width}}  {r['kiln_ms']:7.3f}  {r['ort_ms']:7.3f}  {r['kiln_over_ort']:7.2f}x"
              f"  {r['max_abs_diff']:.1e}")
    kiln_sum, ort_sum = sum(r["kiln_ms"] for r in layers), sum(r["ort_ms"] for r in layers)
    print(f"{'sum of the layers':{width}}  {kiln_sum:7.3f}  {ort_sum:7.3f}  {kiln_sum / ort_sum:7.2f}x")

    if args.out:
        report = {
            "benchmark": "each Conv of a model (with the Add and Relu/Clip after it) alone, kiln CPU engine "
                         "against ONNX Runtime's CPU provider",
            "model": args.model or os.path.basename(args.onnx),
            "batch": args.batch,
            **cpu_compare.run_record(args.threads, args.runs, args.rounds, load_before),
            "call_overhead": overhead,
            "sum_kiln_ms": kiln_sum,
            "sum_ort_ms": ort_sum,
            "layers": layers,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
