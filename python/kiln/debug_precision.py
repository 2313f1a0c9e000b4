"""`kiln debug precision`: which layers of a quantized (INT8 or FP8) model, or of an fp16 GPU
engine, to keep in higher precision for the output to stay within a tolerance of float32's, and
how sensitive each layer is (as Polygraphy's `debug precision` answers for TensorRT).

    kiln debug precision model.onnx --calib data.npy                        # top-1 within 0.5 points
    kiln debug precision model.onnx --calib calib/ --metric cosine --budget 0.001
    kiln debug precision model.onnx --calib data.npy --fp8 --json report.json
    kiln debug precision model.onnx --fp16 --metric relative-l2 --budget 0.001   # on the GPU

It calibrates on the data but its last --budget-batches batches, which it holds out, then on the
CPU engine (whose INT8 kernels and FP8 arithmetic are the reference the GPU's match) scores the
model on them with every eligible layer quantized, with each layer alone kept in float (every
layer's sensitivity, ranked), and with the fewest layers kept in float, most sensitive first,
that bring the output within the budget by the metric: top1 (points of top-1 agreement with
float32 lost; classifiers), cosine (1 - cosine similarity of the output) or relative-l2. It prints
the ranking and the `kiln build` flags that keep those layers in float (`--layer-precision
NAME=fp16`; `--accuracy-budget` makes the same choice while building). Exit status 0 when the
budget is met, 1 when it is not even with every layer in float or on an error.

With --fp16 it does the same for an fp16 GPU engine on the GPU: float32 is the strict float32
engine, each fp16 layer (as `kiln inspect --optimize` lists them) is scored alone in float32, and
the fewest kept in float32 are printed as `--layer-precision NAME=fp32`. It measures on the last
--budget-batches batches of --calib DATA, or without --calib on as many batches of random inputs
(floats ~ N(0,1), integers in 0..9) at the model's shapes (--shapes/--dim for dynamic ones). One
engine is built per layer scored; they share a timing cache, so only the first times tactics.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from kiln._usage import UsageParser

METRIC_FIELDS = {"top1": "top1_agreement_percent", "cosine": "cosine", "relative-l2": "relative_l2"}


def log(message: str) -> None:
    print(f"kiln debug precision: {message}", flush=True)


def describe(score: dict) -> str:
    """A score by every measure (an output with inf or NaN has an infinite error, which JSON
    writes as null)."""
    if score["relative_l2"] is None:
        return "the output has inf or NaN (top-1 agreement 0%, cosine -1, relative L2 inf)"
    return (f"top-1 agreement {score['top1_agreement_percent']:.2f}%, cosine {score['cosine']:.6f}, "
            f"relative L2 {score['relative_l2']:.4f}")


def main(argv: list[str]) -> int:
    p = UsageParser(prog="kiln debug precision", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the ONNX model")
    p.add_argument("--calib", help="calibration data, as kiln build --calib takes it (.npy, a folder, fashion-mnist); "
                                   "with --fp16 the data measured on (default: random inputs)")
    precision_group = p.add_mutually_exclusive_group()
    precision_group.add_argument("--fp8", action="store_true", help="FP8 (E4M3) instead of INT8")
    precision_group.add_argument("--fp16", action="store_true",
                                 help="an fp16 GPU engine: which layers to keep in float32 (runs on the GPU)")
    p.add_argument("--shapes", nargs="+", default=[], help="--fp16: input shapes, as kiln build --shapes takes them")
    p.add_argument("--dim", nargs="+", default=[], help="--fp16: dynamic dimensions, as kiln build --dim takes them")
    p.add_argument("--gpu", type=int, help="--fp16: the GPU to run on (default 0)")
    p.add_argument("--metric", choices=sorted(METRIC_FIELDS), default="top1", help="what the budget measures (default top1)")
    p.add_argument("--budget", type=float, default=None,
                   help="the tolerance, in the metric's units (default: 0.5 points of top-1, 0.001 for cosine, 0.05 relative L2)")
    p.add_argument("--budget-batches", type=int, default=1, help="calibration batches held out to measure on (default 1)")
    p.add_argument("--calib-batch", type=int, help="rows per calibration batch when --calib is one .npy file")
    p.add_argument("--calib-batches", type=int, help="calibrate on at most this many batches")
    p.add_argument("--json", metavar="FILE", help="also write the analysis as JSON (as kiln build --budget-report does)")
    p.add_argument("--kiln-bin", help="the kiln executable (default: $KILN_BIN, kiln on the PATH)")
    args = p.parse_args(argv)
    if not args.fp16 and not args.calib:
        p.error("the following arguments are required: --calib (INT8 and FP8 calibrate on it; --fp16 needs none)")
    if not args.fp16 and (args.shapes or args.dim or args.gpu is not None):
        p.error("--shapes, --dim and --gpu are for --fp16 (INT8 and FP8 are scored on the CPU engine)")
    budget = args.budget if args.budget is not None else {"top1": 0.5, "cosine": 0.001, "relative-l2": 0.05}[args.metric]
    if budget < 0:
        p.error(f"--budget {budget:g}: a tolerance is not negative")
    if args.budget_batches < 1:
        p.error("--budget-batches must be at least 1")
    if not os.path.isfile(args.model):
        sys.exit(f"kiln: error: kiln debug precision: {args.model}: no such file")
    from kiln.compare import find_kiln

    kiln = find_kiln(args.kiln_bin)
    precision = "--fp16" if args.fp16 else "--fp8" if args.fp8 else "--int8"
    fmt = "fp16" if args.fp16 else "FP8" if args.fp8 else "INT8"
    higher = "float32" if args.fp16 else "float"
    # What the printed build command needs besides the kept layers: the data (INT8, FP8), the shapes.
    shape_flags = ([] if not args.shapes else ["--shapes", *args.shapes]) + ([] if not args.dim else ["--dim", *args.dim])
    with tempfile.TemporaryDirectory(prefix="kiln-precision-") as work:
        report_path = os.path.join(work, "report.json")
        command = [kiln, "build", args.model, precision, "--accuracy-budget", f"{budget:g}", "--accuracy-metric", args.metric,
                   "--budget-batches", str(args.budget_batches), "--budget-report", report_path,
                   "-o", os.path.join(work, "model.engine")]
        if args.fp16:
            command += ["--device", "cuda", *shape_flags] + (["--gpu", str(args.gpu)] if args.gpu is not None else [])
        else:
            command += ["--device", "cpu"]
        if args.calib:
            command += ["--calib", args.calib]
        if args.calib_batch:
            command += ["--calib-batch", str(args.calib_batch)]
        if args.calib_batches:
            command += ["--calib-batches", str(args.calib_batches)]
        if args.fp16:
            log(f"{args.model}: scoring every fp16 layer alone in float32 against the float32 engine (GPU; one build each)")
        else:
            log(f"{args.model}: calibrating, then scoring every quantized layer on the held-out data (CPU engine)")
        # The build's progress (a line per layer scored) goes straight through, on stderr.
        result = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        if result.returncode != 0:
            return 1
        with open(report_path) as f:
            report = json.load(f)
        if args.json:
            shutil.copyfile(report_path, args.json)
    field = METRIC_FIELDS[args.metric]
    log(f"all {fmt}: {describe(report['all_quantized'])}")
    ranking = report["ranking"]
    if ranking:
        # The order the budget keeps layers in float: the lowest relative L2 error with the layer alone in float first.
        log(f"each of the {len(ranking)} {fmt} layers alone in {higher}, most sensitive first:")
        width = max(len(r["layer"]) for r in ranking)
        print(f"  {'':3}  {'layer':<{width}}  {args.metric:>12}  {'relative L2':>12}", flush=True)
        for i, r in enumerate(ranking, 1):
            score = r["alone_in_float"]
            if score["relative_l2"] is None:  # inf or NaN in the output
                print(f"  {i:3d}  {r['layer']:<{width}}  {'non-finite':>12}  {'inf':>12}", flush=True)
            else:
                print(f"  {i:3d}  {r['layer']:<{width}}  {score[field]:12.6g}  {score['relative_l2']:12.6g}", flush=True)
    kept = report["float_layers"]
    if not kept:
        log(f"within the budget ({args.metric} {budget:g}) with every layer in {fmt}: nothing to keep in {higher}")
    else:
        log(f"{len(kept)} layer(s) kept in {higher}: {describe(report['with_float_layers'])}"
            + ("" if report["met"] else f": the budget ({args.metric} {budget:g}) is NOT met even so"))
    pin = "fp32" if args.fp16 else "fp16"
    data = shape_flags if args.fp16 else ["--calib", args.calib]
    flags = [precision, *data] + [x for layer in kept for x in ("--layer-precision", f"{layer}={pin}")]
    log("build it so: " + shlex.join(["kiln", "build", args.model, *flags]))
    if args.json:
        log(f"wrote {args.json}")
    return 0 if report["met"] else 1
