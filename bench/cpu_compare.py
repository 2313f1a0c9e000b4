#!/usr/bin/env python3
"""kiln's CPU engine against ONNX Runtime's CPU provider, model by model, in one run.

    .venv/bin/python bench/cpu_compare.py --kiln build/kiln --out bench/results/cpu_compare.json

Rows (--rows picks some): ResNet-50 at batches 1 and 8, MobileNet-V2 at batch 1, BERT-base
(sequence 128, a quarter of each row padding) at batch 1, all float32, and ResNet-50 and
BERT-base INT8 at batch 1: kiln's INT8 CPU engine against ONNX Runtime on the QDQ model
`kiln quantize` writes from the same calibration cache (the same scales). Models are torchvision's and HF
transformers' architectures with seeded random weights (batch-norm statistics measured on
random images), exported at opset 17; calibration uses 32 seeded random rows of inputs. A row
named MODEL_bf16 (e.g. resnet50_bf16:1, not in the default set) times kiln's engine of bfloat16
products (`kiln build --device cpu --bf16`) against ONNX Runtime's float32 run of the same model
(its CPU provider has no bfloat16 products on x86).

Each round runs every engine in a fresh process of its own (kiln through its Python module,
ONNX Runtime with intra_op_num_threads = --threads; --baseline DIR adds another kiln build,
its kiln and python/, to tell a code change from the machine's drift), engines alternating, so load from other
processes hits all of them alike and no engine's idle threads spin while another one runs. Both
get the same inputs, and their outputs are compared: max |diff| for float32, cosine similarity
to ONNX Runtime's float32 output for INT8 (both engines') and for bfloat16 (with the relative L2
difference). The JSON has a row per model and
batch, {"model", "batch", "threads", "precision", "kiln_ms", "ort_ms", ...} with medians, the
CPU named, the command and the kiln commit.
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
import cpu_resnet50  # noqa: E402  (stats, kiln_commit, machine)

ROWS = ["resnet50:1", "resnet50:8", "mobilenet_v2:1", "bert_base:1", "resnet50_int8:1", "bert_base_int8:1"]
BERT_SEQ = 128


def export(model: str, path: str) -> None:
    import torch

    if model == "bert_base":
        import transformer_bench

        module = transformer_bench.bert_module("bert_base")
        args = tuple(bert_inputs(2, 0))
        names = ["input_ids", "attention_mask"]
        torch.onnx.export(module, tuple(torch.from_numpy(a) for a in args), path, dynamo=False, opset_version=17,
                          input_names=names, output_names=["output"],
                          dynamic_axes={n: {0: "batch"} for n in names + ["output"]})
        return
    import torchvision

    torch.manual_seed(0)
    module = getattr(torchvision.models, model)(weights=None)
    # Batch-norm statistics of the network's own activations on random images, as training
    # leaves them: with torchvision's initial statistics (mean 0, variance 1) the activations of
    # deep narrow networks such as MobileNet-V2 shrink to about 1e-8 by the classifier, and a
    # comparison of outputs would compare zeros.
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.momentum = None  # a plain average over the batches below
    module.train()
    with torch.no_grad():
        for _ in range(2):
            module(torch.randn(16, 3, 224, 224))
    module.eval()
    torch.onnx.export(module, (torch.randn(1, 3, 224, 224),), path, dynamo=False, opset_version=17,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})


def run_record(threads: int, runs: int, rounds: int, load_before) -> dict:
    """What a result file says of its run: the command, kiln's commit, ONNX Runtime's version, the
    machine, the timing settings, the load around the run and the date."""
    import onnxruntime as ort

    return {
        "command": " ".join([os.path.relpath(sys.executable)] + sys.argv),
        "kiln_commit": cpu_resnet50.kiln_commit(HERE),
        "onnxruntime": ort.__version__,
        "machine": cpu_resnet50.machine(),
        "threads": threads,
        "runs_per_round": runs,
        "rounds": rounds,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def bert_inputs(batch: int, seed: int):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 30522, (batch, BERT_SEQ), dtype=np.int64)
    mask = np.ones((batch, BERT_SEQ), dtype=np.int64)
    mask[:, BERT_SEQ * 3 // 4:] = 0
    return [ids, mask]


def inputs_for(model: str, batch: int, seed: int = 0) -> dict:
    if model == "bert_base":
        return dict(zip(["input_ids", "attention_mask"], bert_inputs(batch, seed)))
    return {"input": np.random.default_rng(seed).standard_normal((batch, 3, 224, 224), dtype=np.float32)}


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


WORKER = r"""
import json, sys, time
import numpy as np
engine_kind, path, inputs_npz, output_npy, threads, runs, warmup = sys.argv[1:8]
feeds = dict(np.load(inputs_npz))
if engine_kind == "kiln":
    import kiln
    kiln.set_cpu_threads(int(threads))
    engine = kiln.Engine.load(path)
    call = lambda: engine.run(feeds)
else:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    runtime = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    call = lambda: dict(zip([o.name for o in runtime.get_outputs()], runtime.run(None, feeds)))
for _ in range(int(warmup)):
    out = call()
times = []
for _ in range(int(runs)):
    t0 = time.perf_counter()
    out = call()
    times.append((time.perf_counter() - t0) * 1e3)
np.save(output_npy, np.asarray(next(iter(out.values())), dtype=np.float32))
print(json.dumps({"times_ms": times}))
"""


def time_engine(kind, path, inputs_npz, output_npy, threads, runs, warmup, kiln_python):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [kiln_python, os.environ.get("PYTHONPATH")] if p))
    r = run([sys.executable, "-c", WORKER, kind, path, inputs_npz, output_npy, str(threads), str(runs), str(warmup)],
            env=env)
    return json.loads(r.stdout.strip().splitlines()[-1])["times_ms"], np.load(output_npy)


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "build", "kiln"), help="the kiln CLI")
    ap.add_argument("--kiln-python", default=os.path.join(HERE, "..", "build", "python"),
                    help="folder holding kiln's Python module")
    ap.add_argument("--rows", default=",".join(ROWS), help="MODEL:BATCH, comma-separated, from " + ",".join(ROWS))
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--runs", type=int, default=20, help="timed runs per engine per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "kiln_cpu_compare"),
                    help="folder for models, engines and inputs (models are kept and reused)")
    ap.add_argument("--baseline", help="another kiln build folder (its kiln and python/), timed in the same rounds")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu_compare.json"))
    args = ap.parse_args()
    rows = [(r.split(":")[0], int(r.split(":")[1])) for r in args.rows.split(",")]
    import torchvision

    def variant(model):
        """(the model without its suffix, "int8" | "bf16" | "fp32")."""
        for suffix in ("int8", "bf16"):
            if model.endswith("_" + suffix):
                return model[:-len(suffix) - 1], suffix
        return model, "fp32"

    for model, _ in rows:
        base = variant(model)[0]
        if base != "bert_base" and not hasattr(torchvision.models, base):
            raise SystemExit(f"unknown model {model}: bert_base or a torchvision model name, with _int8 for INT8 or "
                             "_bf16 for bfloat16 products")
    os.makedirs(args.work, exist_ok=True)
    kiln = os.path.abspath(args.kiln)

    # Models, engines and inputs, prepared before anything is timed.
    plans = []
    for model, batch in rows:
        base, precision = variant(model)
        int8 = precision == "int8"
        onnx_path = os.path.join(args.work, f"{base}.onnx")
        if not os.path.exists(onnx_path):
            print(f"exporting {base}", flush=True)
            export(base, onnx_path)
        engine = os.path.join(args.work, f"{model}_b{batch}.cpu.engine")
        ort_model = onnx_path
        build = ["build", onnx_path, "--device", "cpu", "--batch", str(batch)]
        if int8:
            # 32 rows of other inputs than the timed ones, one <input name>.npy each.
            calib = os.path.join(args.work, f"{base}_calib")
            os.makedirs(calib, exist_ok=True)
            for name, value in inputs_for(base, 32, seed=1000).items():
                np.save(os.path.join(calib, f"{name}.npy"), value)
            cache = os.path.join(args.work, f"{base}.calib")
            ort_model = os.path.join(args.work, f"{base}.qdq.onnx")
            print(f"calibrating {base} and writing its QDQ model", flush=True)
            run([kiln, "quantize", onnx_path, "--calib", calib, "--batch", "8", "--calib-cache", cache, "-o", ort_model])
            build += ["--int8", "--calib-cache", cache]
        if precision == "bf16":
            build += ["--bf16"]
        print(f"building {os.path.basename(engine)}", flush=True)
        run([kiln] + build + ["-o", engine])
        baseline_engine = None
        if args.baseline:
            baseline_engine = os.path.join(args.work, f"baseline_{model}_b{batch}.cpu.engine")
            run([os.path.join(os.path.abspath(args.baseline), "kiln")] + build + ["-o", baseline_engine])
        inputs = os.path.join(args.work, f"{base}_b{batch}_inputs.npz")
        np.savez(inputs, **inputs_for(base, batch))
        plans.append({"model": model, "base": base, "batch": batch, "precision": precision, "engine": engine,
                      "baseline_engine": baseline_engine, "ort_model": ort_model, "onnx": onnx_path,
                      "inputs": inputs})

    load_before = os.getloadavg()
    kinds = ["kiln", "ort"] + (["baseline"] if args.baseline else [])
    times = {id(p): {kind: [] for kind in kinds} for p in plans}
    outputs = {}
    for round_index in range(args.rounds):
        for p in plans:
            for kind in kinds if round_index % 2 == 0 else kinds[::-1]:
                path = {"kiln": p["engine"], "ort": p["ort_model"], "baseline": p["baseline_engine"]}[kind]
                python = os.path.join(os.path.abspath(args.baseline), "python") if kind == "baseline" else \
                    os.path.abspath(args.kiln_python)
                out_npy = os.path.join(args.work, f"out_{kind}_{p['model']}_b{p['batch']}.npy")
                t, y = time_engine("ort" if kind == "ort" else "kiln", path, p["inputs"], out_npy, args.threads,
                                   args.runs, args.warmup, python)
                times[id(p)][kind] += t
                outputs[(id(p), kind)] = y
                print(f"round {round_index + 1}/{args.rounds} {p['model']} batch {p['batch']} {kind}: "
                      f"median {np.median(t):.2f} ms", flush=True)

    results = []
    for p in plans:
        k, o = cpu_resnet50.stats(times[id(p)]["kiln"]), cpu_resnet50.stats(times[id(p)]["ort"])
        row = {"model": p["model"], "batch": p["batch"], "threads": args.threads,
               "precision": p["precision"], "kiln_ms": k["median_ms"], "ort_ms": o["median_ms"],
               "kiln_over_ort": k["median_ms"] / o["median_ms"], "kiln": k, "ort": o}
        if args.baseline:
            base_stats = cpu_resnet50.stats(times[id(p)]["baseline"])
            row.update(baseline_ms=base_stats["median_ms"], baseline=base_stats,
                       kiln_over_baseline=k["median_ms"] / base_stats["median_ms"])
        y_kiln, y_ort = outputs[(id(p), "kiln")], outputs[(id(p), "ort")]
        if p["precision"] == "bf16":
            # ONNX Runtime runs the float32 model here: its output is the reference.
            a, b = y_kiln.reshape(y_ort.shape).astype(np.float64), y_ort.astype(np.float64)
            row["kiln_cosine_to_fp32"] = cosine(y_kiln, y_ort)
            row["kiln_relative_l2_to_fp32"] = float(np.linalg.norm(a - b) / np.linalg.norm(b))
        elif p["precision"] == "int8":
            # Both quantized outputs against ONNX Runtime's float32 one on the same inputs.
            out_npy = os.path.join(args.work, f"out_fp32_{p['base']}.npy")
            _, y_fp32 = time_engine("ort", p["onnx"], p["inputs"], out_npy, args.threads, 1, 0,
                                    os.path.abspath(args.kiln_python))
            row["kiln_cosine_to_fp32"] = cosine(y_kiln, y_fp32)
            row["ort_cosine_to_fp32"] = cosine(y_ort, y_fp32)
        else:
            row["max_abs_diff"] = float(np.max(np.abs(y_kiln.reshape(y_ort.shape) - y_ort)))
            row["max_abs_output"] = float(np.max(np.abs(y_ort)))
        results.append(row)
    fp32 = {(r["model"], r["batch"]): r for r in results if r["precision"] == "fp32"}
    for r in results:
        base = fp32.get((variant(r["model"])[0], r["batch"])) if r["precision"] != "fp32" else None
        if base:
            r[f"kiln_fp32_over_kiln_{r['precision']}"] = base["kiln_ms"] / r["kiln_ms"]

    report = {
        "benchmark": "kiln CPU engine against ONNX Runtime's CPU provider; random weights, opset 17",
        **run_record(args.threads, args.runs, args.rounds, load_before),
        **({"baseline_commit": cpu_resnet50.kiln_commit(args.baseline)} if args.baseline else {}),
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"\n{'model':<16}{'batch':>6}{'precision':>10}{'kiln ms':>10}{'ORT ms':>10}{'kiln/ORT':>10}"
          + (f"{'baseline ms':>13}" if args.baseline else ""))
    for r in results:
        ratio = f"kiln_fp32_over_kiln_{r['precision']}"
        ratio_text = f"; kiln fp32 / {r['precision']} {r[ratio]:.2f}x" if ratio in r else ""
        if r["precision"] == "int8":
            extra = f"  cosine to fp32: kiln {r['kiln_cosine_to_fp32']:.5f}, ORT {r['ort_cosine_to_fp32']:.5f}" + ratio_text
        elif r["precision"] == "bf16":
            extra = (f"  to ORT's fp32: cosine {r['kiln_cosine_to_fp32']:.5f}, relative L2 "
                     f"{r['kiln_relative_l2_to_fp32']:.1e}" + ratio_text)
        else:
            extra = f"  max|diff| {r['max_abs_diff']:.1e} (|y| <= {r['max_abs_output']:.1f})"
        base = f"{r['baseline_ms']:>13.2f}" if args.baseline else ""
        print(f"{r['model']:<16}{r['batch']:>6}{r['precision']:>10}{r['kiln_ms']:>10.2f}{r['ort_ms']:>10.2f}"
              f"{r['kiln_over_ort']:>9.2f}x{base}{extra}")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
