#!/usr/bin/env python3
"""Compares per-layer profiles of builds of kiln, several runs each (`kiln bench ENGINE --device
cpu --profile --exportProfile FILE`), layer by layer and in groups of layers.

    python3 bench/profile_compare.py base='prof_base_*.json' new='prof_new_*.json' \
        --group 'stem=^/conv1/' --group 'downsample=downsample' --json out.json

Each layer's time in a build is the least of its medians over that build's runs (a layer another
build has and this one does not counts 0 ms here, and is named): on a shared
machine a run's medians move together with the machine's load, and the least is the one least
disturbed (docs/design/cpu-gemm.md, "Only the ratio of one run means something"). Layers go to
the first group whose regular expression matches their name (the rest to "other"). Prints the
groups' and the whole engine's sums per build; --json writes them with every layer's times.
"""
from __future__ import annotations

import argparse
import glob
import json
import re
import sys


def load_layers(path: str) -> dict[str, float]:
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, list):  # kiln bench writes one entry per batch
        if len(data) != 1:
            sys.exit(f"profile_compare: {path} holds {len(data)} batches; profile one batch per file")
        data = data[0]
    try:
        return {layer["name"]: float(layer["median_ms"]) for layer in data["profile"]["layers"]}
    except (KeyError, TypeError) as e:
        sys.exit(f"profile_compare: {path} is not a kiln bench --exportProfile file ({e})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", help="LABEL=GLOB: a build's profile files")
    ap.add_argument("--group", action="append", default=[], help="NAME=REGEX over layer names, first match wins")
    ap.add_argument("--json", help="write the comparison here")
    args = ap.parse_args()

    groups = []
    for spec in args.group:
        name, sep, pattern = spec.partition("=")
        if not sep or not name:
            sys.exit(f"profile_compare: --group wants NAME=REGEX, not '{spec}'")
        groups.append((name, re.compile(pattern)))
    best: dict[str, dict[str, float]] = {}
    files: dict[str, list[str]] = {}
    for spec in args.builds:
        label, sep, pattern = spec.partition("=")
        if not sep or not label:
            sys.exit(f"profile_compare: a build is LABEL=GLOB, not '{spec}'")
        paths = sorted(glob.glob(pattern))
        if not paths:
            sys.exit(f"profile_compare: no file matches {pattern} (build {label})")
        runs = [load_layers(p) for p in paths]
        names = list(runs[0])
        for p, run in zip(paths[1:], runs[1:]):
            if list(run) != names:
                sys.exit(f"profile_compare: {p} has other layers than {paths[0]}")
        best[label] = {n: min(run[n] for run in runs) for n in names}
        files[label] = paths
    labels = list(best)
    # Builds may run other layers (a pass that removes a Transpose): a layer a build does not run
    # counts 0 ms there, and is listed.
    names = list(best[labels[0]])
    for label in labels[1:]:
        names += [n for n in best[label] if n not in names]
    for n in names:
        missing = [label for label in labels if n not in best[label]]
        if missing:
            print(f"layer {n} is not in build(s) {', '.join(missing)}")

    def group_of(name: str) -> str:
        return next((g for g, rx in groups if rx.search(name)), "other")

    order = [g for g, _ in groups] + ["other"]
    sums = {label: {g: 0.0 for g in order} for label in labels}
    for n in names:
        for label in labels:
            sums[label][group_of(n)] += best[label].get(n, 0.0)
    width = max(len(g) for g in order + ["whole engine"])
    print(f"{'':{width}s}  " + "  ".join(f"{label:>10s}" for label in labels) + "   (ms, sums of each layer's least median)")
    for g in order:
        if any(sums[label][g] for label in labels):
            print(f"{g:{width}s}  " + "  ".join(f"{sums[label][g]:10.3f}" for label in labels))
    totals = {label: sum(best[label].values()) for label in labels}
    print(f"{'whole engine':{width}s}  " + "  ".join(f"{totals[label]:10.3f}" for label in labels))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"files": files, "groups": {g: rx.pattern for g, rx in groups}, "group_ms": sums,
                       "total_ms": totals, "layer_ms": best}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
