#!/usr/bin/env python3
"""One kind of node inside a whole model on the CPU engine, kiln builds against each other on the
model's real inputs (a detection model's image, where random inputs select few boxes and its
Loop barely runs), in alternating rounds.

    .venv/bin/python bench/cpu_node_ab.py --model MODEL.onnx --input NAME=FILE.npy [--input ...] \\
        --build before=BUILD_DIR --build after=BUILD_DIR --op Loop [--rounds 2] [--runs 3] --out FILE

Each round runs every build in turn in a process of its own (the build's Python package,
BUILD_DIR/python): the model is built for the CPU engine and run once, then profiled --runs times
(`kiln.Engine.profile`: each node timed by the wall clock); a run's figure is the sum of the
times of the nodes of type --op, and of every node. The JSON has each round's figures, and per
build the least and largest.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

_CHILD = r"""
import json, sys
import numpy as np
import kiln
model, op, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
feeds = {name: np.load(path) for name, path in (a.split("=", 1) for a in sys.argv[4:])}
engine = kiln.Engine.from_onnx(model)
engine.run(feeds)
out = []
for _ in range(runs):
    rows = engine.profile(feeds)
    out.append({"op_ms": sum(r["ms"] for r in rows if r["op"] == op), "all_ms": sum(r["ms"] for r in rows)})
print(json.dumps(out))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--input", action="append", default=[], help="NAME=FILE.npy (repeatable)")
    p.add_argument("--build", action="append", required=True, help="LABEL=BUILD_DIR (repeatable)")
    p.add_argument("--op", required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    builds = [b.split("=", 1) for b in args.build]
    rounds = []
    for r in range(args.rounds):
        order = builds[r % len(builds):] + builds[:r % len(builds)]
        figures = {}
        for label, folder in order:
            env = dict(os.environ, PYTHONPATH=os.path.join(folder, "python"))
            done = subprocess.run([sys.executable, "-c", _CHILD, args.model, args.op, str(args.runs), *args.input],
                                  env=env, capture_output=True, text=True, check=True)
            figures[label] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"round {r + 1} {label}: {args.op} " + " ".join(f"{x['op_ms']:.1f}" for x in figures[label])
                  + " ms; all nodes " + " ".join(f"{x['all_ms']:.0f}" for x in figures[label]) + " ms", flush=True)
        rounds.append(figures)
    summary = {}
    for label, _ in builds:
        op_ms = [x["op_ms"] for f in rounds for x in f[label]]
        all_ms = [x["all_ms"] for f in rounds for x in f[label]]
        summary[label] = {"op_ms_least": min(op_ms), "op_ms_largest": max(op_ms), "all_ms_least": min(all_ms),
                          "all_ms_largest": max(all_ms)}
    result = {"benchmark": f"{args.op} nodes of {os.path.basename(args.model)} on the CPU engine, builds in alternating rounds",
              "command": " ".join(["bench/cpu_node_ab.py", *sys.argv[1:]]),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
              "rounds": rounds, "summary": summary}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
