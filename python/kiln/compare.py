"""`kiln compare`: one model with PyTorch and with kiln on one device, into one results JSON.

    kiln compare resnet50 --device cuda --batches 1,8,128 -o out/results.json
    kiln compare resnet18 --device cpu --batches 1,4 --size 64 -o out/results.json
    kiln report out/results.json -o out/report

PyTorch: eager fp32, eager fp16 (GPU), torch.compile(mode="reduce-overhead") (fp16 on a GPU,
fp32 on the CPU). kiln: fp32, fp16 (GPU), bf16 (CPU: bfloat16 products), int8 and fp8 engines
through the `kiln` command line
(`kiln bench` times them, `kiln run` gives their outputs, `kiln build` their engine files).
The model is a torchvision name, a transformer by name (bert_base, bert_large, roberta_base,
distilbert_base, gpt2, hf:TYPE[:KEY=VALUE,...]; text models take --seq-len tokens) or
module:function (see `kiln export`), with random weights unless the function loads some; --onnx
gives an exported file to use instead of exporting.

    kiln compare bert_base --seq-len 128 --batches 1,32 --kiln fp16 -o out/bert_base.json

Timing: PyTorch on a GPU with CUDA events around each call, synchronized after each (as `kiln
bench` times kiln); on the CPU the wall clock around each call. Accuracy: each variant's first output
on one batch of random inputs against PyTorch eager fp32's: cosine similarity, relative L2 error,
largest difference, and for [batch, classes] outputs the top-1 agreement. The file's schema is
docs/results-schema.md ("kiln.compare/1").
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

SCHEMA = "kiln.compare/1"
TORCH_VARIANTS = ("eager-fp32", "eager-fp16", "compile")
KILN_VARIANTS = ("fp32", "fp16", "int8", "fp8", "bf16")
DEFAULT_KILN_VARIANTS = ("fp32", "fp16", "int8")


def log(message: str) -> None:
    print(f"kiln compare: {message}", flush=True)


def find_kiln(explicit: str | None) -> str:
    """The kiln command line: --kiln-bin, $KILN_BIN, `kiln` on the PATH, or a build next to the sources."""
    candidates = [explicit, os.environ.get("KILN_BIN"), shutil.which("kiln")]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    candidates += [os.path.join(root, d, "kiln") for d in ("build", "build-gpu")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise SystemExit("kiln compare: cannot find the kiln command line: pass --kiln-bin or set KILN_BIN")


def latency_stats(times_ms: list[float]) -> dict:
    t = sorted(times_ms)
    pick = lambda p: t[min(len(t) - 1, round(p * (len(t) - 1)))]  # noqa: E731
    return {"median": statistics.median(t), "mean": statistics.fmean(t), "p90": pick(0.9), "p99": pick(0.99),
            "min": t[0]}


def time_torch(fn, device: str, runs: int, warmup: int) -> list[float]:
    import torch

    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    return times


def accuracy_entry(runtime: str, variant: str, out: np.ndarray, ref: np.ndarray) -> dict:
    if np.shape(out) != np.shape(ref):
        raise RuntimeError(f"{runtime} {variant}: output shape {list(np.shape(out))}, the reference's {list(ref.shape)}")
    a = np.asarray(out, dtype=np.float64).reshape(ref.shape[0], -1)
    r = np.asarray(ref, dtype=np.float64).reshape(ref.shape[0], -1)
    cos = float(np.dot(a.ravel(), r.ravel()) / (np.linalg.norm(a) * np.linalg.norm(r) + 1e-300))
    rel = float(np.linalg.norm(a - r) / (np.linalg.norm(r) + 1e-300))
    # Top-1 agreement means something for class scores only ([batch, classes]), not for features.
    top1 = float(np.mean(a.argmax(1) == r.argmax(1))) if ref.ndim == 2 else None
    return {"runtime": runtime, "variant": variant, "top1_agreement": top1, "max_abs_diff": float(np.max(np.abs(a - r))),
            "cosine": cos, "relative_l2": rel, "top1": None}


def first_output(out):
    """A module's first output: the tensor itself, or the first of a tuple or list."""
    return out[0] if isinstance(out, (tuple, list)) else out


def to_torch(arrays: list[np.ndarray], device: str, half: bool) -> list:
    """numpy inputs as tensors on the device; with half, float inputs in float16 (images channels-last)."""
    import torch

    out = []
    for a in arrays:
        t = torch.from_numpy(a).to(device)
        if half and t.is_floating_point():
            t = t.half()
            if t.dim() == 4:
                t = t.to(memory_format=torch.channels_last)
        out.append(t)
    return out


class Comparison:
    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.results: list[dict] = []
        self.sizes: list[dict] = []
        self.accuracy: list[dict] = []
        self.work = args.work or tempfile.mkdtemp(prefix="kiln-compare-")
        os.makedirs(self.work, exist_ok=True)

    def add_error(self, runtime: str, variant: str, precision: str, batches: list[int], error: str) -> None:
        log(f"{runtime} {variant}: not measured: {error}")
        for b in batches:
            self.results.append({"runtime": runtime, "variant": variant, "precision": precision, "batch": b,
                                 "error": error})

    # --- PyTorch -----------------------------------------------------------------------------
    def run_torch(self, spec, x_acc: list[np.ndarray]) -> np.ndarray:
        import torch

        a, dev = self.a, self.a.device
        module = spec.module.to(dev)
        with torch.inference_mode():
            ref = first_output(module(*to_torch(x_acc, dev, False))).float().cpu().numpy()
        self.sizes.append({"runtime": "pytorch", "variant": "eager-fp32",
                           "engine_bytes": sum(p.numel() * p.element_size() for p in module.parameters())})
        for variant in a.torch:
            if variant == "eager-fp16" and dev == "cpu":
                self.add_error("pytorch", variant, "fp16", a.batches, "float16 in PyTorch is for GPUs here")
                continue
            half = variant == "eager-fp16" or (variant == "compile" and dev == "cuda")
            try:
                m = spec.module.to(dev)
                if half:
                    m = m.half().to(memory_format=torch.channels_last)
                if variant == "compile":
                    torch._dynamo.reset()
                    m = torch.compile(m, mode="reduce-overhead")
                acc_out = None
                for i, b in enumerate(a.batches):
                    log(f"pytorch {variant}: batch {b} ({i + 1}/{len(a.batches)})")
                    x = to_torch(spec.make_inputs(b, 1), dev, half)
                    with torch.inference_mode():
                        times = time_torch(lambda: m(*x), dev, a.runs, a.warmup)
                    self.results.append({"runtime": "pytorch", "variant": variant,
                                         "precision": "fp16" if half else "fp32", "batch": b,
                                         "latency_ms": latency_stats(times), "throughput": b * 1000 / statistics.median(times),
                                         "runs": len(times)})
                if variant != "eager-fp32":
                    with torch.inference_mode():
                        acc_out = first_output(m(*to_torch(x_acc, dev, half))).float().cpu().numpy()
                    self.accuracy.append(accuracy_entry("pytorch", variant, acc_out, ref))
                if half:
                    self.sizes.append({"runtime": "pytorch", "variant": variant,
                                       "engine_bytes": sum(p.numel() * 2 for p in spec.module.parameters())})
            except Exception as e:  # a variant that fails is recorded, the others go on
                self.add_error("pytorch", variant, "fp16" if half else "fp32", a.batches, f"{type(e).__name__}: {e}")
            finally:
                spec.module.float().to(memory_format=torch.contiguous_format)
        return ref

    # --- kiln --------------------------------------------------------------------------------
    def kiln_cmd(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        cmd = [self.kiln, *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
            raise RuntimeError(lines[-1] if lines else f"{' '.join(cmd[:2])} failed with exit code {r.returncode}")
        return r

    def precision_flags(self, variant: str) -> list[str]:
        flags = ["--device", self.a.device, f"--{variant}"]
        if self.a.device == "cuda":  # every build of the comparison shares its layer timings
            flags += ["--timing-cache", os.path.join(self.work, "timing.cache")]
        if variant in ("int8", "fp8"):  # one calibration for both
            flags += ["--calib", self.calib, "--calib-batch", "8", "--calib-cache", os.path.join(self.work, "model.calib")]
        return flags

    def run_kiln(self, onnx: str, x_acc: list[np.ndarray], ref: np.ndarray, spec) -> None:
        a = self.a
        self.kiln = find_kiln(a.kiln_bin)
        if a.calib:
            self.calib = a.calib
        elif len(spec.input_names) == 1:
            self.calib = os.path.join(self.work, "calib.npy")
            np.save(self.calib, spec.make_inputs(a.calib_images, 5)[0])
        else:  # a folder of <input>.npy, every input's rows split into the same batches
            self.calib = os.path.join(self.work, "calib")
            os.makedirs(self.calib, exist_ok=True)
            for name, rows in zip(spec.input_names, spec.make_inputs(a.calib_images, 5)):
                np.save(os.path.join(self.calib, f"{name}.npy"), rows)
        input_flags = []
        for name, x in zip(spec.input_names, x_acc):
            x_path = os.path.join(self.work, f"accuracy_{name}.npy")
            np.save(x_path, x)
            input_flags += ["--input", f"{name}={x_path}"]
        for variant in a.kiln:
            if variant == "fp16" and a.device == "cpu":
                self.add_error("kiln", variant, variant, a.batches, "the CPU engine computes in float32 (fp16 is for GPUs)")
                continue
            if variant == "bf16" and a.device == "cuda":
                self.add_error("kiln", variant, variant, a.batches,
                               "bf16 is the CPU engine's bfloat16 products (GPU engines take fp16)")
                continue
            try:
                log(f"kiln {variant}: kiln bench over batches {','.join(map(str, a.batches))}")
                js = os.path.join(self.work, f"bench_{variant}.json")
                self.kiln_cmd("bench", onnx, *self.precision_flags(variant), "--batches", ",".join(map(str, a.batches)),
                              "--warmup", str(a.warmup), "--iterations", str(a.runs), "--json", js)
                with open(js) as f:
                    bench = json.load(f)["results"]
                for r in bench:
                    self.results.append({"runtime": "kiln", "variant": variant, "precision": r["precision"],
                                         "batch": r["batch"], "latency_ms": {k: r["latency_ms"][k] for k in
                                                                             ("median", "mean", "p90", "p99", "min")},
                                         "throughput": r["throughput_per_s"], "runs": r["iterations"]})
                log(f"kiln {variant}: outputs on the accuracy batch")
                out_dir = os.path.join(self.work, f"outputs_{variant}")
                run_flags = ["--batch", str(len(x_acc[0]))] if a.device == "cuda" else []
                self.kiln_cmd("run", onnx, *self.precision_flags(variant), *run_flags, *input_flags,
                              "--output-dir", out_dir)
                out = np.load(os.path.join(out_dir, f"{spec.output_names[0]}.npy"))
                self.accuracy.append(accuracy_entry("kiln", variant, out, ref))
                size = {"runtime": "kiln", "variant": variant, "engine_bytes": None}
                last = bench[-1]
                for key, name in (("weights_bytes", "weight_bytes"), ("activation_bytes", "activation_bytes")):
                    if key in last:
                        size[name] = last[key]
                if a.device == "cuda":
                    engine = os.path.join(self.work, f"{variant}.engine")
                    self.kiln_cmd("build", onnx, *self.precision_flags(variant), "--batch", str(max(a.batches)),
                                  "-o", engine)
                    size["engine_bytes"] = os.path.getsize(engine)
                self.sizes.append(size)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                self.add_error("kiln", variant, variant, [b for b in a.batches
                                                          if not any(r["runtime"] == "kiln" and r["variant"] == variant
                                                                     and r["batch"] == b for r in self.results)], str(e))


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kiln compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="torchvision model name, transformer name (bert_base, hf:TYPE, ...) or "
                                 "module:function (see kiln export --list)")
    p.add_argument("-o", "--output", required=True, help="results JSON to write")
    p.add_argument("--onnx", help="an ONNX export of the model to use (default: export it)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when PyTorch sees a GPU")
    p.add_argument("--batches", default="1,8", help="batch sizes, e.g. 1,8,128")
    p.add_argument("--size", type=int, default=224, help="image height and width")
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=128, help="text models: tokens per input")
    p.add_argument("--torch", default=",".join(TORCH_VARIANTS), help=f"PyTorch variants ({', '.join(TORCH_VARIANTS)})")
    p.add_argument("--kiln", default=",".join(DEFAULT_KILN_VARIANTS), help=f"kiln variants ({', '.join(KILN_VARIANTS)})")
    p.add_argument("--runs", type=int, default=50, help="timed runs per configuration")
    p.add_argument("--warmup", type=int, default=10, help="untimed runs first")
    p.add_argument("--calib", help="INT8/FP8 calibration data for kiln (as kiln calibrate's --calib; default: random inputs)")
    p.add_argument("--calib-images", type=int, default=32, help="random calibration inputs when --calib is not given")
    p.add_argument("--accuracy-batch", type=int, default=8, help="rows of the batch the outputs are compared on")
    p.add_argument("--kiln-bin", help="the kiln executable (default: $KILN_BIN, kiln on the PATH)")
    p.add_argument("--work", help="folder for the export, engines and outputs (default: a temporary one)")
    a = p.parse_args(argv)
    try:
        a.batches = [int(b) for b in a.batches.split(",")]
        if any(b <= 0 for b in a.batches):
            raise ValueError
    except ValueError:
        p.error(f"--batches takes positive integers separated by commas, not {a.batches!r}")
    a.torch = [v for v in a.torch.split(",") if v]
    a.kiln = [v for v in a.kiln.split(",") if v]
    for v in a.torch:
        if v not in TORCH_VARIANTS:
            p.error(f"unknown PyTorch variant {v!r} ({', '.join(TORCH_VARIANTS)})")
    for v in a.kiln:
        if v not in KILN_VARIANTS:
            p.error(f"unknown kiln variant {v!r} ({', '.join(KILN_VARIANTS)})")

    import torch

    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("kiln compare: --device cuda, but PyTorch sees no GPU")
    try:
        from kiln import export
    except ImportError:  # run as a file, or by scripts/: the exporter sits next to this module
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import export  # type: ignore

    c = Comparison(a)
    spec = export.load_model(a.model, size=a.size, channels=a.channels, seq_len=a.seq_len)
    safe_name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in a.model)
    onnx = a.onnx or os.path.join(c.work, f"{safe_name}.onnx")
    if not a.onnx:
        log(f"exporting {a.model} to {onnx}")
        export.export(spec, onnx, "torchscript", 17)
    x_acc = spec.make_inputs(a.accuracy_batch, 123)
    ref = c.run_torch(spec, x_acc)
    c.run_kiln(onnx, x_acc, ref, spec)

    import onnx as onnx_lib

    graph_inputs = onnx_lib.load(onnx, load_external_data=False).graph.input
    shape_of = lambda i: [d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim]  # noqa: E731
    results = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "kiln compare " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": {"name": a.model, "onnx": onnx, "input": graph_inputs[0].name, "input_shape": shape_of(graph_inputs[0]),
                  "inputs": [{"name": i.name, "shape": shape_of(i)} for i in graph_inputs],
                  "parameters": int(sum(p.numel() for p in spec.module.parameters())),
                  "onnx_bytes": os.path.getsize(onnx)},
        "device": {"kind": a.device, "name": device_name(a.device), "torch": torch.__version__,
                   "kiln": subprocess.run([find_kiln(a.kiln_bin), "--version"], capture_output=True,
                                          text=True).stdout.strip().splitlines()[0].removeprefix("kiln ")},
        "timing": (f"{a.runs} timed runs after {a.warmup} warm-up runs per configuration; "
                   + ("CUDA events around each call, synchronized after each (PyTorch and kiln alike)"
                      if a.device == "cuda" else "wall clock around each call (PyTorch and kiln alike)"))
                   + ("; PyTorch eager fp32 lets cuDNN use TF32 (torch.backends.cudnn.allow_tf32 = "
                      f"{torch.backends.cudnn.allow_tf32}), kiln fp32 is strict float32" if a.device == "cuda" else ""),
        "results": c.results,
        "sizes": c.sizes,
        "accuracy": {"reference": "pytorch eager-fp32",
                     "inputs": f"{a.accuracy_batch} rows of the model's random inputs (seed 123: images normal, "
                               "token ids uniform, attention masks padded at the end)",
                     "entries": c.accuracy},
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
    with open(a.output, "w") as f:
        json.dump(results, f, indent=1)
    log(f"wrote {a.output}: {sum('error' not in r for r in c.results)} measurements, "
        f"{sum('error' in r for r in c.results)} configurations that could not run")
    print(f"\n{'runtime':<9}{'variant':<12}{'batch':>6}{'median ms':>11}{'items/s':>11}")
    for r in c.results:
        if "error" in r:
            print(f"{r['runtime']:<9}{r['variant']:<12}{r['batch']:>6}   ({r['error'][:60]})")
        else:
            print(f"{r['runtime']:<9}{r['variant']:<12}{r['batch']:>6}{r['latency_ms']['median']:>11.3f}"
                  f"{r['throughput']:>11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
