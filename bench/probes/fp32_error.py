#!/usr/bin/env python3
"""How far each fp32 engine is from a float64 reference, on the GPU machine (a probe).

    KILN_BIN=build-gpu/kiln python3 bench/probes/fp32_error.py --out DIR [--models resnet50,resnet18]
                                                              [--seeds 4] [--batch 8] [--builds 2]

The GPU test compares kiln's fp32 GPU engine with kiln's CPU engine at a relative L2 error of
1e-4. With random weights a deep network amplifies every rounding difference (see
tests/gpu/test_gpu_models.py), so the question a failure there asks is whose error it is.
This probe runs each model (the GPU tests' export) in float64 PyTorch on the CPU, the reference,
and measures the relative L2 error of: kiln's CPU engine, kiln's fp32 GPU engine (built
--builds times: each build times its tactics anew), PyTorch fp32 on the CPU, and PyTorch fp32
on the GPU (cuDNN benchmark mode, TF32 off). Also lists each GPU build's convolution tactics.
Writes DIR/fp32_error.json.

--no-gpu measures the CPU columns alone (kiln's CPU engine and PyTorch fp32 on the CPU), on any
machine; --cpu-baseline KILN adds another kiln binary's CPU engine (a build with a change to the
CPU kernels against one without it).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

import export_model  # noqa: E402
from e2e_models import E2eModel, exported_model  # noqa: E402


def rel_l2(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def kiln(args, binary=None):
    r = subprocess.run([binary or os.environ.get("KILN_BIN", os.path.join(ROOT, "build-gpu", "kiln"))] + args,
                       capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        raise SystemExit(f"kiln {' '.join(args)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return r.stdout


def kiln_output(model_or_engine, inputs, names, folder, *extra, binary=None):
    os.makedirs(folder, exist_ok=True)
    args = ["run", model_or_engine, "--top-k", "0", "-o", folder]
    for i, (name, array) in enumerate(zip(names, inputs)):
        path = os.path.join(folder, f"in_{i}.npy")
        np.save(path, array)
        args += ["--input", f"{name}={path}"]
    kiln(args + list(extra), binary)
    outs = sorted(f for f in os.listdir(folder) if f.endswith(".npy") and not f.startswith("in_"))
    return np.load(os.path.join(folder, outs[0]))


def torch_output(module, inputs, device, dtype):
    import torch

    with torch.no_grad():
        out = module.to(device=device, dtype=dtype)(*[torch.from_numpy(a).to(device=device, dtype=dtype) for a in inputs])
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out.double().cpu().numpy()


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="resnet50,resnet18")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--builds", type=int, default=2)
    ap.add_argument("--no-gpu", action="store_true", help="the CPU columns only")
    ap.add_argument("--cpu-baseline", help="another kiln binary whose CPU engine is measured too")
    a = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    cache = os.environ.get("KILN_MODEL_CACHE") or os.path.join(ROOT, "tests", "e2e", ".models",
                                                                f"torch-{torch.__version__.split('+')[0]}")
    os.makedirs(cache, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="fp32_error_")
    result = {"gpu": None if a.no_gpu else torch.cuda.get_device_name(0), "torch": torch.__version__,
              "batch": a.batch, "command": " ".join(sys.argv), "models": {}}
    for name in a.models.split(","):
        model = E2eModel(name, 64)
        path = exported_model(cache, model, "torchscript")
        spec = export_model.load_model(name, size=64)
        engines, tactics = [], []
        for b in range(0 if a.no_gpu else a.builds):
            engine = os.path.join(work, f"{name}-{b}.engine")
            kiln(["build", path, "--fp32", "-o", engine, "--shapes", f"{spec.input_names[0]}:{a.batch}x3x64x64"])
            engines.append(engine)
            layers = json.loads(kiln(["inspect", engine, "--json"]))["layers"]
            counts = collections.Counter(l["tactic"].split(" #")[0] for l in layers if l["op"].startswith("Conv"))
            tactics.append(dict(counts))
        rows = []
        for seed in range(a.seeds):
            inputs = export_model.input_maker(name, size=64)(a.batch, seed=seed)
            ref = torch_output(spec.module, inputs, "cpu", torch.float64)
            cpu = kiln_output(path, inputs, spec.input_names, os.path.join(work, "cpu"), "--device", "cpu")
            row = {"seed": seed, "kiln_cpu": rel_l2(cpu, ref),
                   "torch_cpu_fp32": rel_l2(torch_output(spec.module, inputs, "cpu", torch.float32), ref)}
            if a.cpu_baseline:
                base = kiln_output(path, inputs, spec.input_names, os.path.join(work, "cpu_baseline"), "--device",
                                   "cpu", binary=a.cpu_baseline)
                row["kiln_cpu_baseline"] = rel_l2(base, ref)
                row["kiln_cpu_vs_baseline"] = rel_l2(cpu, base)
            if not a.no_gpu:
                torch_gpu = torch_output(spec.module, inputs, "cuda", torch.float32)
                gpu = [kiln_output(engine, inputs, spec.input_names, os.path.join(work, f"gpu{b}"))
                       for b, engine in enumerate(engines)]
                row["torch_gpu_fp32"] = rel_l2(torch_gpu, ref)
                for b, out in enumerate(gpu):
                    row[f"kiln_gpu_fp32_build{b}"] = rel_l2(out, ref)
                row["kiln_gpu_build0_vs_kiln_cpu"] = rel_l2(gpu[0], cpu)
                row["torch_gpu_fp32_vs_kiln_cpu"] = rel_l2(torch_gpu, cpu)
            rows.append(row)
            print(name, json.dumps(row), flush=True)
        result["models"][name] = {"rows": rows, "conv_tactics_per_build": tactics}
        print(name, "conv tactics per build:", json.dumps(tactics), flush=True)
    with open(os.path.join(a.out, "fp32_error.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
