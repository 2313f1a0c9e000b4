#!/usr/bin/env python3
"""One dynamic engine against static ones, in one run on one GPU (the dynamic-shapes issue).

    python3 bench/dynamic_bench.py --out DIR [--model resnet50] [--batches 1,8,128] [--rounds 2]

ResNet-50 (random weights, 3x224x224, exported with a dynamic batch by scripts/export_model.py):
- static kiln fp16 engines, one built per batch (`kiln bench --fp16 --batches ...`);
- one kiln fp16 engine with a profile from batch 1 to 256, opt 128 (`kiln build --min-shapes
  ... --opt-shapes ... --max-shapes ...`), its build time, and `kiln bench ENGINE --batches ...`
  at the same batches, then the sweep 1,4,8,16,32 on it;
- the peer: torch.compile(mode="reduce-overhead") on the fp16 channels-last model at the same
  batches (bench/gpu_bench.py's timing).
Static and dynamic are timed in alternating rounds (static, dynamic, static, dynamic, ...); the
ratio uses each configuration's median latency averaged over the rounds. Writes DIR/dynamic_bench.json
and prints a table; commit the JSON under bench/results/.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench  # noqa: E402  (export, run, kiln_bench, torch_peers, kiln_bin)


def bench_engine(engine: str, batches: list[int], out: str, tag: str) -> list[dict]:
    js = os.path.join(out, f"kiln_{tag}.json")
    r = gpu_bench.run([gpu_bench.kiln_bin(), "bench", engine, "--batches", ",".join(map(str, batches)), "--json", js])
    print(r.stdout, flush=True)
    with open(js) as f:
        return json.load(f)["results"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batches", default="1,8,128")
    ap.add_argument("--min", type=int, default=1)
    ap.add_argument("--opt", type=int, default=128)
    ap.add_argument("--max", type=int, default=256)
    ap.add_argument("--sweep", default="1,4,8,16,32")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    import torch

    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "kiln": gpu_bench.run([gpu_bench.kiln_bin(), "--version"]).stdout.strip(), "command": " ".join(sys.argv),
            "timing": "kiln bench: CUDA events around each CUDA-graph replay, synchronized after each; median of 200 "
                      "runs (50 for batch >= 64) after 20 warm-up runs; torch.compile timed the same way"}
    model = os.path.join(args.out, f"{args.model}-224.onnx")
    gpu_bench.export(args.model, model)
    shape = lambda b: f"input:{b}x3x224x224"  # noqa: E731
    engine = os.path.join(args.out, f"{args.model}_dynamic_fp16.engine")
    t0 = time.time()
    r = gpu_bench.run([gpu_bench.kiln_bin(), "build", model, "--fp16", "--min-shapes", shape(args.min), "--opt-shapes",
                       shape(args.opt), "--max-shapes", shape(args.max), "-o", engine])
    build_s = time.time() - t0
    print(r.stdout, flush=True)
    rounds = []
    for k in range(args.rounds):
        static = gpu_bench.kiln_bench(model, "fp16", batches, args.out)
        dynamic = bench_engine(engine, batches, args.out, f"dynamic_round{k}")
        rounds.append({"static": static, "dynamic": dynamic})
    sweep = bench_engine(engine, [int(b) for b in args.sweep.split(",")], args.out, "dynamic_sweep")
    peers = [] if args.no_peers else gpu_bench.torch_peers(args.model, batches, [])

    summary = []
    for i, b in enumerate(batches):
        s = sum(r["static"][i]["latency_ms"]["median"] for r in rounds) / len(rounds)
        d = sum(r["dynamic"][i]["latency_ms"]["median"] for r in rounds) / len(rounds)
        peer = next((p["median_ms"] for p in peers if p["batch"] == b), None)
        summary.append({"batch": b, "static_ms": s, "dynamic_ms": d, "dynamic_over_static": d / s,
                        "torch_compile_ms": peer,
                        "static_rounds_ms": [r["static"][i]["latency_ms"]["median"] for r in rounds],
                        "dynamic_rounds_ms": [r["dynamic"][i]["latency_ms"]["median"] for r in rounds]})
    result = {"meta": meta, "model": args.model,
              "profile": {"min": args.min, "opt": args.opt, "max": args.max}, "dynamic_build_s": build_s,
              "engine_file_bytes": os.path.getsize(engine), "summary": summary, "rounds": rounds, "sweep": sweep,
              "torch": peers}
    with open(os.path.join(args.out, "dynamic_bench.json"), "w") as f:
        json.dump(result, f, indent=1)

    print(f"\n{meta['gpu']}: {args.model} fp16, one engine with profile {args.min}..{args.max} (opt {args.opt}) "
          f"built in {build_s:.1f} s, against static engines; mean of {args.rounds} rounds' medians")
    print(f"{'batch':>6}{'static ms':>11}{'dynamic ms':>12}{'dyn/static':>12}{'torch.compile ms':>18}")
    for s in summary:
        peer = f"{s['torch_compile_ms']:.4f}" if s["torch_compile_ms"] else "-"
        print(f"{s['batch']:>6}{s['static_ms']:>11.4f}{s['dynamic_ms']:>12.4f}{s['dynamic_over_static']:>12.3f}{peer:>18}")
    print("sweep of the dynamic engine: " + ", ".join(f"b{r['batch']} {r['latency_ms']['median']:.4f} ms "
                                                    f"(first run {r['first_run_ms']:.0f} ms)" for r in sweep))


if __name__ == "__main__":
    main()
