"""`kiln check`: is my engine right? The model through kiln and through a reference on the same
inputs, output by output; on a failure, the first layer whose output diverges.

    kiln check model.onnx                                  # kiln's CPU engine against ONNX Runtime
    kiln check model.onnx --device cuda --fp16 --batch 8   # any `kiln run` engine flag is passed on
    kiln check model.onnx --int8 --calib-cache model.calib --atol 0.1 --rtol 0.1
    kiln check model.onnx --inputs input=x.npy --reference cpu --json report.json

Inputs: --inputs NAME=FILE.npy (repeatable), else --random N sets of seeded random values (float
inputs standard normal, integer inputs in [0, 10), booleans random); dynamic dimensions take
--batch (the first) and --dim NAME=VALUE, else 1. The reference is ONNX Runtime's CPU provider
(--reference onnxruntime, the default) or kiln's own float32 CPU engine (--reference cpu).

Per output: the largest absolute and relative difference, the cosine similarity, for [N, C]
scores the top-1 agreement, and how many elements miss |kiln - ref| <= atol + rtol * |ref| (the
criterion, as numpy.allclose). The defaults follow the precision: 1e-4 for float32, 1e-2 for
tf32/fp16/best, 5e-2 for bf16 (the CPU's bfloat16 products), 0.1 for int8/fp8. Exit status 0 when every output meets it, 1 when one does not
(after bisecting, unless --no-bisect: both engines run again with every intermediate value as an
output, compared in the model's order; the first that misses the criterion is named, with the
node that computes it); a usage error is `kiln: error: ...` and exit status 1 too.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from kiln._usage import UsageParser

# kiln run flags that take a value (the rest of the passed-on flags are switches).
_VALUE_FLAGS = {"--device", "--shapes", "--dim", "--batch", "--calib", "--calib-cache", "--calib-algo",
                "--calib-percentile", "--calib-batches", "--calib-batch", "--layer-precision", "--accuracy-budget",
                "--budget-batches", "--min-shapes", "--opt-shapes", "--max-shapes", "--profile-timing-step",
                "--timing-cache", "--max-memory"}


_SWITCHES = {"--fp16", "--fp32", "--tf32", "--best", "--bf16", "--int8", "--int8-all", "--fp8", "--fp8-all", "--allow-cpu-fallback",
             "--strict", "--no-optimize", "-v", "--verbose"}


def unknown_engine_flag(flags: list[str]) -> str | None:
    """The first of `flags` that is not a kiln run engine flag, or None."""
    return next((f for f in flags if f.startswith("-") and f.split("=")[0] not in _VALUE_FLAGS | _SWITCHES), None)


def log(message: str) -> None:
    print(f"kiln check: {message}", flush=True)


def file_key(name: str) -> str:
    """The file name `kiln run -o` gives a tensor (tools/run.cc's file_name_for)."""
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in name)


def default_tolerance(engine_flags: list[str]) -> float:
    if "--int8" in engine_flags or "--fp8" in engine_flags:
        return 0.1
    if any(f in engine_flags for f in ("--fp16", "--tf32", "--best")):
        return 1e-2
    if "--bf16" in engine_flags:  # operands with 8 significant bits (float16 has 11)
        return 5e-2
    return 1e-4


def make_inputs(model, args) -> list[dict[str, np.ndarray]]:
    """One dict per input set: the given files, or --random sets."""
    from onnx import helper

    initializers = {t.name for t in model.graph.initializer}
    declared = [i for i in model.graph.input if i.name not in initializers]
    if args.inputs:
        given = {}
        names = [i.name for i in declared]
        for spec in args.inputs:
            name, sep, path = spec.partition("=")
            if not sep:
                if len(names) != 1:
                    sys.exit(f"kiln: error: kiln check --inputs {spec}: name the input (NAME=FILE); the model has {names}")
                name, path = names[0], spec
            if name not in names:
                sys.exit(f"kiln: error: kiln check --inputs {spec}: the model has no input '{name}' (its inputs: {names})")
            given[name] = np.load(path)
        missing = [n for n in names if n not in given]
        if missing:
            sys.exit(f"kiln: error: kiln check: no data for input(s) {missing}: give --inputs NAME=FILE.npy for each, or --random N")
        return [given]
    dims = dict(d.split("=", 1) for d in args.dim)
    rng = np.random.default_rng(args.seed)
    sets = []
    for _ in range(args.random):
        feed = {}
        for inp in declared:
            t = inp.type.tensor_type
            shape = []
            for k, d in enumerate(t.shape.dim):
                if d.HasField("dim_value"):
                    shape.append(d.dim_value)
                elif d.dim_param in dims:
                    shape.append(int(dims[d.dim_param]))
                elif k == 0 and args.batch:
                    shape.append(args.batch)
                else:
                    shape.append(1)
            dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
            if np.issubdtype(dtype, np.floating):
                feed[inp.name] = rng.standard_normal(shape).astype(dtype)
            elif dtype == np.bool_:
                feed[inp.name] = rng.random(shape) < 0.5
            else:
                feed[inp.name] = rng.integers(0, 10, size=shape).astype(dtype)
        sets.append(feed)
    return sets


class KilnRunFailed(Exception):
    """`kiln run` exited with an error: its exit status, its standard error, the command."""

    def __init__(self, returncode: int, stderr: str, args: list):
        super().__init__(stderr.strip() or f"exit status {returncode}")
        self.returncode, self.stderr, self.args_run = returncode, stderr, [str(a) for a in args]


def run_kiln(kiln: str, model_path: str, feed: dict, flags: list[str], out_dir: str, mark_all: bool) -> dict[str, np.ndarray]:
    """`kiln run` on the inputs; every .npy it writes, by file name (file_key of the tensor)."""
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(out_dir + ".inputs", exist_ok=True)
    args = [kiln, "run", model_path, "--top-k", "0", "-o", out_dir, *flags]
    for i, (name, array) in enumerate(feed.items()):
        path = os.path.join(out_dir + ".inputs", f"{i}.npy")
        np.save(path, array)
        args += ["--input", f"{name}={path}"]
    if mark_all:
        args += ["--mark-outputs", "all"]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise KilnRunFailed(r.returncode, r.stderr, args)
    return {f[:-4]: np.load(os.path.join(out_dir, f)) for f in os.listdir(out_dir) if f.endswith(".npy")}


def run_onnxruntime(model, feed: dict, extra_outputs: list[str]) -> dict[str, np.ndarray]:
    import onnx
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    present = {o.name for o in m.graph.output}
    for name in extra_outputs:
        if name not in present:
            m.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed)))


def compare(got: np.ndarray, want: np.ndarray, atol: float, rtol: float) -> dict:
    result = {"shape": list(want.shape), "kiln_shape": list(got.shape)}
    if got.shape != want.shape:
        result.update(ok=False, why=f"shape {list(got.shape)}, the reference {list(want.shape)}")
        return result
    if want.dtype == np.bool_ or not np.issubdtype(want.dtype, np.number):
        bad = int(np.count_nonzero(got != want))
        result.update(ok=bad == 0, mismatched=bad, elements=int(want.size))
        return result
    g, w = got.astype(np.float64), want.astype(np.float64)
    diff = np.abs(g - w)
    finite = np.isfinite(w) & np.isfinite(g)
    same_special = (~np.isfinite(w)) & ((g == w) | (np.isnan(g) & np.isnan(w)))
    miss = ~((finite & (diff <= atol + rtol * np.abs(w))) | same_special)
    rel = diff / np.maximum(np.abs(w), atol)  # relative where the reference is not near zero
    norm = np.linalg.norm(g[finite]) * np.linalg.norm(w[finite])
    result.update(
        ok=not miss.any(), mismatched=int(miss.sum()), elements=int(w.size),
        max_abs=float(diff[finite].max()) if finite.any() else 0.0,
        max_rel=float(rel[finite].max()) if finite.any() else 0.0,
        cosine=float(np.dot(g[finite], w[finite]) / norm) if norm > 0 else (1.0 if not g[finite].any() else 0.0))
    if w.ndim == 2 and w.shape[0] > 0 and w.shape[1] > 1 and np.issubdtype(want.dtype, np.floating):
        result["top1_agreement"] = float(np.mean(np.argmax(g, axis=1) == np.argmax(w, axis=1)))
    return result


def describe(name: str, r: dict) -> str:
    if "why" in r:
        return f"{name}: {r['why']}"
    if "max_abs" not in r:
        return f"{name}: {r['mismatched']} of {r['elements']} differ"
    line = (f"{name} {r['shape']}: max abs {r['max_abs']:.3g}, max rel {r['max_rel']:.3g}, cosine {r['cosine']:.6f}, "
            f"{r['mismatched']} of {r['elements']} outside tolerance")
    if "top1_agreement" in r:
        line += f", top-1 agreement {r['top1_agreement']:.4f}"
    return line


def bisect(kiln: str, model, model_path: str, feed: dict, flags: list[str], reference: str, atol: float, rtol: float,
           work: str) -> dict | None:
    """The first value, in the model's node order, that both engines compute and that misses the
    criterion: what the first diverging layer computes."""
    got = run_kiln(kiln, model_path, feed, flags, os.path.join(work, "bisect-kiln"), mark_all=True)
    order = [(out, node) for node in model.graph.node for out in node.output if out]
    keys: dict[str, list[str]] = {}
    for out, _ in order:
        keys.setdefault(file_key(out), []).append(out)
    comparable = [(out, node) for out, node in order if file_key(out) in got and len(keys[file_key(out)]) == 1]
    if reference == "onnxruntime":
        want = run_onnxruntime(model, feed, [out for out, _ in comparable])
    else:
        ref_files = run_kiln(kiln, model_path, feed, ["--device", "cpu"], os.path.join(work, "bisect-ref"), mark_all=True)
        want = {out: ref_files[file_key(out)] for out, _ in comparable if file_key(out) in ref_files}
    checked = 0
    for out, node in comparable:
        if out not in want:
            continue
        checked += 1
        r = compare(got[file_key(out)], want[out], atol, rtol)
        if not r["ok"]:
            return {"value": out, "node": node.name, "op": node.op_type, "compared_before": checked - 1, **r}
    return None


def main(argv: list[str] | None = None) -> int:
    try:
        return _check(argv)
    except KilnRunFailed as e:
        sys.stderr.write(e.stderr)
        sys.exit(f"kiln: error: kiln check: kiln run failed (exit {e.returncode}): {' '.join(e.args_run)}")


def _check(argv: list[str] | None) -> int:
    p = UsageParser(prog="kiln check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the ONNX model")
    p.add_argument("--inputs", action="append", default=[], metavar="NAME=FILE.npy", help="input data (repeatable)")
    p.add_argument("--random", type=int, default=1, metavar="N", help="sets of random inputs when --inputs is not given")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, help="the first dimension of inputs whose first dimension is dynamic")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE", help="a dynamic dimension's value")
    p.add_argument("--atol", type=float, help="absolute tolerance (default: by precision)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default: by precision)")
    p.add_argument("--reference", choices=("onnxruntime", "cpu"), default="onnxruntime")
    p.add_argument("--no-bisect", action="store_true", help="on a failure, do not look for the first diverging layer")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON (- for standard output)")
    p.add_argument("--kiln-bin", help="the kiln executable (default: $KILN_BIN, kiln on the PATH)")
    args, engine_flags = p.parse_known_args(argv)
    if unknown := unknown_engine_flag(engine_flags):
        p.error(f"unknown option {unknown} (kiln check's own options and kiln run's engine flags are accepted)")
    if args.batch:
        engine_flags += ["--batch", str(args.batch)]
    for d in args.dim:
        engine_flags += ["--dim", d]
    from kiln.compare import find_kiln  # the same lookup as kiln compare

    import onnx

    kiln = find_kiln(args.kiln_bin)
    model = onnx.load(args.model)
    tol = default_tolerance(engine_flags)
    atol = args.atol if args.atol is not None else tol
    rtol = args.rtol if args.rtol is not None else tol
    reference = "ONNX Runtime (CPU)" if args.reference == "onnxruntime" else "kiln's CPU engine (float32)"
    log(f"{args.model}: kiln {' '.join(engine_flags) or '(CPU engine, float32)'} against {reference}, "
        f"atol {atol:g}, rtol {rtol:g}")
    report = {"model": args.model, "engine_flags": engine_flags, "reference": args.reference, "atol": atol, "rtol": rtol,
              "sets": [], "ok": True}
    with tempfile.TemporaryDirectory(prefix="kiln-check-") as work:
        for s, feed in enumerate(make_inputs(model, args)):
            got = run_kiln(kiln, args.model, feed, engine_flags, os.path.join(work, f"kiln{s}"), mark_all=False)
            if args.reference == "onnxruntime":
                want = run_onnxruntime(model, feed, [])
            else:
                files = run_kiln(kiln, args.model, feed, ["--device", "cpu"], os.path.join(work, f"ref{s}"), mark_all=False)
                want = {o.name: files[file_key(o.name)] for o in model.graph.output if file_key(o.name) in files}
            outputs = {}
            for out in model.graph.output:
                if file_key(out.name) not in got or out.name not in want:
                    outputs[out.name] = {"ok": False, "why": "missing from " + ("kiln" if out.name in want else "the reference")}
                else:
                    outputs[out.name] = compare(got[file_key(out.name)], want[out.name], atol, rtol)
                log(("ok    " if outputs[out.name]["ok"] else "FAIL  ") + describe(out.name, outputs[out.name]))
            entry = {"outputs": outputs, "ok": all(r["ok"] for r in outputs.values())}
            if not entry["ok"] and not args.no_bisect:
                log("bisecting: every intermediate value of both engines, in the model's order")
                first = bisect(kiln, model, args.model, feed, engine_flags, args.reference, atol, rtol, work)
                entry["first_divergence"] = first
                if first:
                    log(f"first divergence: value '{first['value']}' of node '{first['node']}' ({first['op']}), after "
                        f"{first['compared_before']} values that agree: {describe(first['value'], first)}")
                else:
                    log("no intermediate value misses the criterion (the difference builds up, or lies in values kiln "
                        "fuses away)")
            report["sets"].append(entry)
            report["ok"] &= entry["ok"]
    log("PASSED" if report["ok"] else "FAILED")
    if args.json:
        text = json.dumps(report, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
