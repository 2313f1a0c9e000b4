#!/usr/bin/env python3
"""Transformers on kiln's GPU engine and PyTorch, in one run on one GPU.

    python3 bench/transformer_bench.py --out DIR [--models bert_base,vit_b_16] [--kiln A[,B]]
                                       [--precisions fp16,int8,fp8] [--layer-choices] [--peers] [--rounds 2]

Models (random weights, seeded; exported with torch.onnx's TorchScript exporter, opset 17, a
dynamic batch):
  bert_base  HF transformers BertModel with BERT-base's config (12 layers, hidden 768, 12 heads),
             sequence 128, inputs input_ids and attention_mask (a quarter of each row padding);
             batches 1 and 32
  bert_large BertModel with BERT-large's config (24 layers, hidden 1024, 16 heads), sequence
             384, inputs as bert_base; batches 1 and 8
  vit_b_16   torchvision's ViT-B/16 at 224x224 (its zero-initialized classifier given seeded
             random weights); batches 1 and 128
Each kiln binary given (--kiln: one, or two to compare an older build with a newer one; they
are timed in alternating rounds, the order swapped every round) runs `kiln bench --fp16`, and
with --precisions also `--int8` / `--fp8` (products quantized where faster, the rest fp16) on
scales the first binary calibrates once per model on the GPU (`kiln calibrate --device cuda`,
entropy unless --calib-algo says otherwise, e.g. vit_b_16=percentile) from 64 rows of inputs
made like the timed ones but from another seed. --layer-choices adds, for each of int8 and fp8
given, the build's own layer-by-layer timing at the large batch (`kiln build -v`: each quantized product against its fp16 form, the quantize and reformat layers
charged to it, the choice, and the whole engines timed), parsed into the JSON; the log is kept.
--peers adds PyTorch eager fp16 and torch.compile(mode="reduce-overhead") fp16 on the same
inputs, timed as bench/gpu_bench.py times them. --fidelity adds each binary's output at the
small batch in every precision against PyTorch's float32 output (cosine, relative L2 error),
beside PyTorch's own fp16 eager output against the same float32 one; with --layer-choices also
at the large batch, the quantized outputs from the engines --layer-choices built. Writes DIR/transformer_bench.json and prints a
table; commit the JSON under bench/results/. Exports, engines' JSON and profiles stay in
--work (default DIR/work).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench  # noqa: E402  (run, time_fn, machine)

SEQ = {"bert_base": 128, "bert_large": 384}
BATCHES = {"bert_base": [1, 32], "bert_large": [1, 8], "vit_b_16": [1, 128]}
BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}


def bert_module(name: str):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(attn_implementation="eager", **(BERT_LARGE if name == "bert_large" else {}))
    bert = BertModel(config).eval()

    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return Wrapper(bert)


def inputs_for(name: str, batch: int, seed: int | None = None):
    import torch

    g = torch.Generator().manual_seed(batch if seed is None else seed)
    if name in SEQ:
        seq = SEQ[name]
        ids = torch.randint(0, 30522, (batch, seq), generator=g)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[:, seq * 3 // 4:] = 0
        return [ids, mask]
    return [torch.randn(batch, 3, 224, 224, generator=g)]


def module_for(name: str):
    import torch
    import torchvision

    if name in SEQ:
        return bert_module(name)
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)().eval()
    # torchvision starts the classifier at zero, which would make every output 0 (and the
    # fidelity figures empty): a seeded random classifier instead.
    torch.nn.init.normal_(m.heads.head.weight, std=0.02)
    return m


def export(name: str, path: str) -> None:
    import torch

    if os.path.exists(path):
        return
    module = module_for(name)
    args = tuple(inputs_for(name, 2))
    names = input_names(name)
    torch.onnx.export(module, args, path, dynamo=False, opset_version=17, input_names=names, output_names=["output"],
                      dynamic_axes={n: {0: "batch"} for n in names + ["output"]})


def precision_flags(precision: str, cache: str | None) -> list[str]:
    return ["--fp16"] if precision == "fp16" else [f"--{precision}", "--calib-cache", cache]


def calibrate(kiln: str, name: str, model: str, work: str, algorithm: str = "entropy") -> tuple[str, float]:
    """Scales for --int8 / --fp8: 64 rows of inputs (another seed than the timed ones), batches
    of 16, histograms on the GPU, `algorithm` as kiln calibrate's --calib-algo (entropy, minmax,
    or percentile at its default 99.99%). Returns (cache, seconds)."""
    import numpy as np

    data = os.path.join(work, f"calib_{name}")
    os.makedirs(data, exist_ok=True)
    for n, x in zip(input_names(name), inputs_for(name, 64, seed=1000)):
        np.save(os.path.join(data, f"{n}.npy"), x.numpy())
    cache = os.path.join(work, f"{name}.calib")
    t0 = time.time()
    r = gpu_bench.run([kiln, "calibrate", model, "--calib", data, "--batch", "16", "--device", "cuda",
                       "--calib-algo", algorithm, "-o", cache])
    print(r.stdout[-500:], flush=True)
    return cache, time.time() - t0


LAYER_LINE = re.compile(r"\] (int8|fp8): (\S+): (?:INT8|FP8) ([0-9.]+) ms \+ ([0-9.]+) ms quantize/reformat "
                        r"vs fp16 ([0-9.]+) ms -> (\S+)")
ENGINE_LINE = re.compile(r"(int8|fp8): whole engine, (.+): ([0-9.]+) ms")


def parse_layer_choices(log: str) -> dict:
    """The layer-by-layer choice of a `kiln build --int8|--fp8 -v` log: every product's time in the
    quantized engine and in the fp16 one, and the whole engines' times."""
    layers = [{"layer": m[2], "quantized_ms": float(m[3]), "quantize_reformat_ms": float(m[4]), "fp16_ms": float(m[5]),
               "choice": m[6]} for m in LAYER_LINE.finditer(log)]
    engines = {m[2]: float(m[3]) for m in ENGINE_LINE.finditer(log)}
    return {"layers": layers, "whole_engine_ms": engines}


def layer_choices(kiln: str, name: str, model: str, batch: int, precision: str, cache: str, out: str, work: str) -> dict:
    """`kiln build` of the quantized engine at `batch`, verbose, into `work`; its log kept in `out`."""
    engine = os.path.join(work, f"choices_{precision}.engine")
    r = gpu_bench.run([kiln, "build", model, f"--{precision}", "--calib-cache", cache, "--batch", str(batch), "-v", "-o", engine])
    log = r.stdout + r.stderr
    with open(os.path.join(out, f"layer_choices_{name}_b{batch}_{precision}.log"), "w") as f:
        f.write(log)
    return {"batch": batch, "command": f"kiln build MODEL --{precision} --calib-cache CACHE --batch {batch} -v",
            **parse_layer_choices(log)}


def kiln_bench(kiln: str, model: str, batches: list[int], work: str, tag: str, flags: list[str]) -> dict[int, tuple[float, float]]:
    """`kiln bench` with `flags` (the precision): per batch, the median latency (ms) and the
    engine's build time (s, cold: kiln bench builds without a timing cache)."""
    js = os.path.join(work, f"kiln_{tag}_{os.path.basename(model)}.json")
    r = gpu_bench.run([kiln, "bench", model, *flags, "--batches", ",".join(map(str, batches)), "--json", js])
    print(r.stdout[-2000:], flush=True)
    with open(js) as f:
        return {row["batch"]: (row["latency_ms"]["median"], row.get("build_s", float("nan")))
                for row in json.load(f)["results"]}


def profile_by_op(kiln: str, model: str, batch: int, work: str, flags: list[str], tag: str) -> dict:
    """`kiln bench --profile` at one batch: each op type's share of the layers' time."""
    js = os.path.join(work, f"profile_{tag}_{os.path.basename(model)}_{batch}.json")
    gpu_bench.run([kiln, "bench", model, *flags, "--batch", str(batch), "--profile", "--json", js])
    with open(js) as f:
        prof = json.load(f)["results"][0]["profile"]
    by_op: dict[str, float] = {}
    for layer in prof["layers"]:
        by_op[layer.get("op", "?")] = by_op.get(layer.get("op", "?"), 0.0) + layer["median_ms"]
    return {"batch": batch, "total_ms": prof["total_ms"],
            "ms_by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1]))}


def peers(name: str, batches: list[int]) -> list[dict]:
    import torch

    rows = []
    m = module_for(name).half().cuda()
    with torch.inference_mode():
        for variant in ("torch_eager_fp16", "torch_compile_reduce-overhead_fp16"):
            fn = m
            if variant.startswith("torch_compile"):
                torch._dynamo.reset()
                fn = torch.compile(m, mode="reduce-overhead")
            for bs in batches:
                xs = [x.cuda() for x in inputs_for(name, bs)]
                if name == "vit_b_16":
                    xs = [xs[0].half()]
                t0 = time.time()
                fn(*xs)
                torch.cuda.synchronize()
                first_s = time.time() - t0
                med, p99 = gpu_bench.time_fn(lambda: fn(*xs), 200 if bs <= 32 else 50)
                rows.append({"cfg": variant, "batch": bs, "median_ms": med, "p99_ms": p99, "first_call_s": first_s})
                print(json.dumps({"model": name, **rows[-1]}), flush=True)
    del m
    torch.cuda.empty_cache()
    return rows


def input_names(name: str) -> list[str]:
    return ["input_ids", "attention_mask"] if name in SEQ else ["input"]


def fidelity(binaries: list[str], name: str, model: str, batch: int, work: str, precisions: dict[str, str | None],
             engines: dict[str, str] | None = None, first_index: int = 0) -> dict:
    """Each binary's output in each precision (`kiln run --device cuda` with the precision's flags,
    or the engine file `engines` names for that precision) and PyTorch's fp16 eager output against
    PyTorch's float32 output, on the same inputs: cosine similarity, relative L2 error. The keys
    name each binary by its place in --kiln (binaries[0] is binary<first_index>)."""
    import numpy as np
    import torch

    xs = inputs_for(name, batch)
    names = input_names(name)
    args = []
    for n, x in zip(names, xs):
        np.save(os.path.join(work, f"fidelity_{n}.npy"), x.numpy())
        args += ["--input", f"{n}={os.path.join(work, f'fidelity_{n}.npy')}"]
    m = module_for(name).cuda()
    with torch.inference_mode():
        ref = m(*[x.cuda() for x in xs]).float().cpu().numpy().astype(np.float64)
        m = m.half()
        cast = [x.cuda().half() if x.is_floating_point() else x.cuda() for x in xs]
        outs = {"torch_eager_fp16": m(*cast).float().cpu().numpy()}
    del m
    torch.cuda.empty_cache()
    for i, b in enumerate(binaries):
        for precision, cache in precisions.items():
            key = f"binary{first_index + i}" + ("" if precision == "fp16" else f"_{precision}")
            out_dir = os.path.join(work, f"fidelity_out_{key}_b{batch}")
            if engines and precision in engines:
                gpu_bench.run([b, "run", engines[precision], "--top-k", "0", "-o", out_dir, *args])
            else:
                gpu_bench.run([b, "run", model, "--device", "cuda", *precision_flags(precision, cache), "--top-k", "0", "-o",
                               out_dir, *args])
            outs[key] = np.load(os.path.join(out_dir, "output.npy"))
    row = {"batch": batch, "reference": "torch float32"}
    for key, out in outs.items():
        out = out.astype(np.float64).reshape(ref.shape)
        row[key] = {"cosine": float((out * ref).sum() / (np.linalg.norm(out) * np.linalg.norm(ref))),
                    "relative_l2": float(np.linalg.norm(out - ref) / np.linalg.norm(ref))}
    print(json.dumps({"model": name, "fidelity": row}), flush=True)
    return row


def calibration_algorithms(spec: str) -> dict[str, str]:
    """--calib-algo: one algorithm for every model ("" key), or MODEL=ALGO pairs."""
    known = ("entropy", "minmax", "percentile")
    algos: dict[str, str] = {}
    for item in spec.split(","):
        model, _, algo = item.rpartition("=")
        if algo not in known:
            sys.exit(f"transformer_bench: unknown calibration algorithm '{algo}' in --calib-algo ({', '.join(known)})")
        if model and model not in BATCHES:
            sys.exit(f"transformer_bench: unknown model '{model}' in --calib-algo ({', '.join(BATCHES)})")
        algos[model] = algo
    return algos


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="bert_base,vit_b_16")
    ap.add_argument("--kiln", default=gpu_bench.kiln_bin(), help="kiln binaries, comma-separated (A,B compares them)")
    ap.add_argument("--peers", action="store_true", help="also PyTorch eager fp16 and torch.compile reduce-overhead")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--precisions", default="fp16", help="kiln precisions, comma-separated, of fp16, int8, fp8")
    ap.add_argument("--layer-choices", action="store_true",
                    help="also the quantized builds' layer-by-layer timing against fp16 at the large batch (last binary)")
    ap.add_argument("--profile", action="store_true", help="also each op type's time at the large batch (last binary, each precision)")
    ap.add_argument("--fidelity", action="store_true", help="also fp16 outputs against PyTorch float32 (small batch)")
    ap.add_argument("--calib-algo", default="entropy",
                    help="calibration for int8/fp8: entropy, minmax or percentile, one for all models or MODEL=ALGO,... "
                         "(models not named: entropy)")
    ap.add_argument("--work", default=None, help="folder for exports and per-run files (default: DIR/work)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = a.work or os.path.join(a.out, "work")
    os.makedirs(work, exist_ok=True)
    binaries = a.kiln.split(",")
    result = {"schema": "kiln.transformer-bench/1", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "machine": gpu_bench.machine(), "kiln": binaries, "models": {}}
    precisions = a.precisions.split(",")
    calib_algos = calibration_algorithms(a.calib_algo)
    for p in precisions:
        if p not in ("fp16", "int8", "fp8"):
            sys.exit(f"transformer_bench: unknown precision '{p}' (fp16, int8, fp8)")
    for name in a.models.split(","):
        path = os.path.join(work, f"{name}.onnx")
        export(name, path)
        batches = BATCHES[name]
        caches: dict[str, str | None] = {p: None for p in precisions}
        entry = {"batches": batches, "kiln": {}}
        if any(p != "fp16" for p in precisions):
            algorithm = calib_algos.get(name, calib_algos.get("", "entropy"))
            cache, seconds = calibrate(binaries[0], name, path, work, algorithm)
            caches = {p: (None if p == "fp16" else cache) for p in precisions}
            entry["calibration"] = {"rows": 64, "batch": 16, "device": "cuda", "algorithm": algorithm, "seconds": seconds}
            if algorithm == "percentile":
                entry["calibration"]["percentile"] = 99.99
        runs = [(b, p) for b in binaries for p in precisions]
        times = {run: {bs: [] for bs in batches} for run in runs}
        builds = {run: {bs: [] for bs in batches} for run in runs}
        for rnd in range(a.rounds):
            order = runs if rnd % 2 == 0 else runs[::-1]
            for b, p in order:
                tag = f"{binaries.index(b)}_{p}_{rnd}"
                for bs, (ms, build_s) in kiln_bench(b, path, batches, work, tag, precision_flags(p, caches[p])).items():
                    times[(b, p)][bs].append(ms)
                    builds[(b, p)][bs].append(build_s)
        for (b, p), per_batch in times.items():
            key = f"binary{binaries.index(b)}" + ("" if p == "fp16" else f"_{p}")
            entry["kiln"][key] = {str(bs): {"median_ms_per_round": v, "mean_ms": statistics.mean(v),
                                            "build_s_per_round": builds[(b, p)][bs]}
                                  for bs, v in per_batch.items()}
        if a.layer_choices:
            for p in precisions:
                if p != "fp16":
                    entry[f"layer_choices_{p}"] = layer_choices(binaries[-1], name, path, batches[-1], p, caches[p], a.out, work)
        if a.profile:
            for p in precisions:
                key = "profile" + ("" if p == "fp16" else f"_{p}")
                entry[key] = profile_by_op(binaries[-1], path, batches[-1], work, precision_flags(p, caches[p]), p)
                print(json.dumps({"model": name, "precision": p, **entry[key]}), flush=True)
        if a.fidelity:
            entry["fidelity"] = fidelity(binaries, name, path, batches[0], work, caches)
            if a.layer_choices and len(precisions) > 1:
                # The quantized engines --layer-choices built at the large batch (the timed
                # build's choices), and fp16 at that batch, against float32 there.
                engines = {p: os.path.join(work, f"choices_{p}.engine") for p in precisions if p != "fp16"}
                entry["fidelity_large_batch"] = fidelity(binaries[-1:], name, path, batches[-1], work, caches, engines,
                                                         first_index=len(binaries) - 1)
        if a.peers:
            entry["peers"] = peers(name, batches)
        result["models"][name] = entry
        with open(os.path.join(a.out, "transformer_bench.json"), "w") as f:
            json.dump(result, f, indent=1)
    columns = [k for k in next(iter(result["models"].values()))["kiln"]] if result["models"] else []
    print(f"{'model':<10} {'batch':>5} " + " ".join(f"{c:>12}" for c in columns) +
          (f" {'eager':>10} {'compile':>10}" if a.peers else ""))
    for name, entry in result["models"].items():
        for bs in entry["batches"]:
            cells = [f"{entry['kiln'][c][str(bs)]['mean_ms']:12.3f}" for c in columns]
            if a.peers:
                for cfg in ("torch_eager_fp16", "torch_compile_reduce-overhead_fp16"):
                    cells.append(next(f"{r['median_ms']:10.3f}" for r in entry["peers"] if r["cfg"] == cfg and r["batch"] == bs))
            print(f"{name:<10} {bs:>5} " + " ".join(cells))


if __name__ == "__main__":
    main()
