#!/usr/bin/env python3
"""torchvision's detection models: a kiln GPU engine (its backbone and heads on the GPU, box
selection and what follows on the CPU engine) against PyTorch on the same GPU, in one run.

    python3 bench/detection_bench.py --out FILE [--models fasterrcnn_mobilenet_v3_large_320_fpn,...]
                                     [--variants torch-eager-fp32,...] [--runs 20] [--work DIR]

Each model (random weights, torch.manual_seed(0); torchvision's score thresholds, or with
--thresholds zero none, as tests/e2e/test_control_flow.py builds them, so that every box reaches
box selection: with random weights that is thousands) takes one image of its native size (320x320 for the
*_320 models, 800x800 for the ResNet-50 ones), exported by torch.onnx (TorchScript exporter,
opset 17). Variants, each timed by the wall clock around one call that returns the detections
(torch: synchronized after the call; kiln: Engine.run, which copies the image in, runs the GPU's
part, copies what the CPU engine's part reads to the host and runs it), median and p90 of --runs
calls after 3 warm-up calls:
  torch-eager-fp32    the model as written: the reference detections
  torch-eager-fp16    model.half()
  torch-compile-fp16  torch.compile(model.half(), mode="reduce-overhead"), in a process of its
                      own with a time limit (detection models' data-dependent shapes break its
                      graphs; a failure or a timeout is recorded)
  kiln-fp16, kiln-fp32  kiln.Builder(device="cuda", precision=...).build(onnx): the per-region
                      heads after box selection on the GPU (row stages)
  kiln-fp16-cpu-tail, kiln-fp32-cpu-tail  the same with gpu_row_stages=False: everything after
                      box selection on the CPU engine
For each variant, the share of the reference's 20 highest-scoring detections it finds too (same
label, score within 2e-2, box corners within 1 pixel) and its build or compile time. The JSON is
rewritten after every measurement.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODELS = ("fasterrcnn_mobilenet_v3_large_320_fpn,ssdlite320_mobilenet_v3_large,retinanet_resnet50_fpn,"
                  "fcos_resnet50_fpn,maskrcnn_resnet50_fpn")
ZERO_THRESHOLDS = {"fasterrcnn_mobilenet_v3_large_320_fpn": {"box_score_thresh": 0.0},
                   "retinanet_resnet50_fpn": {"score_thresh": 0.0}, "ssdlite320_mobilenet_v3_large": {"score_thresh": 0.0},
                   "maskrcnn_resnet50_fpn": {"box_score_thresh": 0.0}, "fasterrcnn_resnet50_fpn": {"box_score_thresh": 0.0},
                   "fcos_resnet50_fpn": {"score_thresh": 0.0}}

VARIANTS = ("torch-eager-fp32", "torch-eager-fp16", "torch-compile-fp16", "kiln-fp16", "kiln-fp32", "kiln-fp16-cpu-tail",
            "kiln-fp32-cpu-tail")


def image_size(name: str) -> int:
    return 320 if "320" in name else 800


def torch_model(name: str, thresholds: str):
    import torch
    import torchvision

    torch.manual_seed(0)
    kwargs = dict(weights=None, weights_backbone=None, **(ZERO_THRESHOLDS[name] if thresholds == "zero" else {}))
    if not name.startswith("ssd"):
        kwargs.update(min_size=image_size(name), max_size=image_size(name))
    return getattr(torchvision.models.detection, name)(**kwargs).eval()


def image(name: str) -> np.ndarray:
    s = image_size(name)
    return np.random.default_rng(0).random((3, s, s)).astype(np.float32)


def export(name: str, work: str, thresholds: str) -> str:
    import torch

    path = os.path.join(work, f"{name}_{image_size(name)}_{thresholds}.onnx")
    if not os.path.exists(path):
        torch.onnx.export(torch_model(name, thresholds), ([torch.from_numpy(image(name))],), path + ".tmp", opset_version=17,
                          dynamo=False, input_names=["images"])
        os.replace(path + ".tmp", path)
    return path


def detections(outputs) -> dict:
    """boxes [n, 4], scores [n], labels [n] as numpy, from torch's dict or kiln's named outputs."""
    if isinstance(outputs, dict) and "boxes" in outputs:
        return {k: outputs[k].detach().float().cpu().numpy() if k != "labels" else outputs[k].cpu().numpy()
                for k in ("boxes", "scores", "labels")}
    values = list(outputs.values())
    return {"boxes": next(v for v in values if v.ndim == 2),
            "scores": next(v for v in values if v.ndim == 1 and v.dtype == np.float32),
            "labels": next(v for v in values if v.dtype == np.int64)}


def found_share(reference: dict, got: dict, top: int = 20) -> float | None:
    """None when the reference has no detection to find."""
    order = np.argsort(-reference["scores"])[:top]
    if len(order) == 0:
        return None
    found = 0
    for i in order:
        close = ((got["labels"] == reference["labels"][i]) & (np.abs(got["scores"] - reference["scores"][i]) < 2e-2) &
                 (np.abs(got["boxes"] - reference["boxes"][i]).max(axis=1) < 1.0))
        found += bool(close.any())
    return found / len(order)


def timed(call, runs: int) -> dict:
    for _ in range(3):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000.0)
    return {"median_ms": float(np.median(times)), "p90_ms": float(np.percentile(times, 90)), "runs": runs}


def torch_variant(name: str, variant: str, runs: int, thresholds: str) -> dict:
    """One PyTorch variant, in this process: its timing and its detections."""
    import torch

    model = torch_model(name, thresholds).cuda()
    x = torch.from_numpy(image(name)).cuda()
    if variant != "torch-eager-fp32":
        model, x = model.half(), x.half()
    fn = model
    if variant == "torch-compile-fp16":
        fn = torch.compile(model, mode="reduce-overhead")

    def call():
        out = fn([x])
        torch.cuda.synchronize()
        return out

    with torch.inference_mode():
        start = time.perf_counter()
        out = call()
        first_s = time.perf_counter() - start
        row = {"first_call_s": first_s, **timed(call, runs)}
    row["detections"] = {k: v.tolist() for k, v in detections(out[0]).items()}
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="the JSON file to write")
    p.add_argument("--models", default=DEFAULT_MODELS)
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="which of the variants to time (torch-eager-fp32, the reference, always runs first)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--work", default="/tmp/detection_bench", help="exported models")
    p.add_argument("--compile-timeout", type=float, default=240, help="seconds torch.compile's process may take")
    p.add_argument("--thresholds", choices=("default", "zero"), default="default",
                   help="torchvision's score thresholds, or 0 (every box reaches box selection)")
    p.add_argument("--worker", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(torch_variant(*args.worker, args.runs, args.thresholds)))
        return
    if not args.out:
        p.error("--out is required")
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}: the variants are {', '.join(VARIANTS)}")

    import torch

    import kiln

    os.makedirs(args.work, exist_ok=True)
    doc = {"schema": "kiln.detection_bench/1", "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "kiln": kiln.__version__,
           "thresholds": args.thresholds, "timing": "wall clock around each call returning the detections (torch synchronized after it), "
                     "median and p90 in ms after 3 warm-up calls", "results": []}

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)

    for name in args.models.split(","):
        print(f"{name}: exporting at {image_size(name)}x{image_size(name)}", flush=True)
        onnx_path = export(name, args.work, args.thresholds)
        reference = None
        for variant in [v for v in VARIANTS if v == "torch-eager-fp32" or v in variants]:
            print(f"{name}: {variant}", flush=True)
            row = {"model": name, "image": [3, image_size(name), image_size(name)], "variant": variant}
            try:
                if variant.startswith("torch"):
                    timeout = args.compile_timeout if "compile" in variant else 600
                    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", name, variant,
                                           "--runs", str(args.runs), "--thresholds", args.thresholds], capture_output=True, text=True, timeout=timeout)
                    if done.returncode != 0:
                        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed")
                    measured = json.loads(done.stdout.strip().splitlines()[-1])
                    found = {k: np.asarray(v, dtype=np.int64 if k == "labels" else np.float32)
                             for k, v in measured.pop("detections").items()}
                    row.update(measured)
                else:
                    start = time.perf_counter()
                    engine = kiln.Builder(device="cuda", precision=variant.split("-")[1],
                                          gpu_row_stages=not variant.endswith("-cpu-tail")).build(onnx_path)
                    row["build_s"] = time.perf_counter() - start
                    layers = engine.info()["layers"]
                    row["data_dependent_nodes"] = engine.info()["data_dependent_nodes"]
                    row["cpu_layers"] = sum(l["cpu_fallback"] for l in layers)
                    row["gpu_layers"] = sum(not l["cpu_fallback"] for l in layers)
                    row["row_stage_layers"] = sum(l["tactic"].startswith("gpu (rows of") for l in layers)
                    feed = {"images": image(name)}
                    row.update(timed(lambda: engine.run(feed), args.runs))
                    found = detections(engine.run(feed))
                    del engine
            except subprocess.TimeoutExpired:
                row["error"] = f"did not finish within {args.compile_timeout:.0f} s"
            except Exception as e:  # a variant that fails is recorded, the others still run
                row["error"] = f"{type(e).__name__}: {e}"[:2000]
            if "error" not in row:
                if variant == "torch-eager-fp32":
                    reference = found
                row["detections"] = int(len(found["scores"]))
                if reference is not None:
                    row["found_of_reference_top20"] = found_share(reference, found)
                print(f"  median {row['median_ms']:.2f} ms  p90 {row['p90_ms']:.2f}  found "
                      f"{row.get('found_of_reference_top20')}", flush=True)
            else:
                print(f"  {row['error'][:300]}", flush=True)
            doc["results"].append(row)
            save()
    save()


if __name__ == "__main__":
    main()
