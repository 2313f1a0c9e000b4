#!/usr/bin/env python3
"""One fp16 engine over a range of sequence lengths against static engines, in one run on one GPU.

    python3 bench/sequence_profile_bench.py --out DIR [--kiln BIN] [--batch 32] [--seqs 64,128,200,384]
                                             [--rounds 2]

HF BertModel with BERT-base's config (random weights, seeded), exported by torch.onnx's
TorchScript exporter (opset 17) with a dynamic batch and sequence; inputs input_ids and
attention_mask. For each sequence length: a static engine (`kiln bench --fp16 --shapes ...`,
built for that shape alone), and one engine built once with the profile sequence 16..512 at the
batch, opt 128 (`kiln build --min-shapes/--opt-shapes/--max-shapes`, its build time recorded),
timed at the same shapes (`kiln bench ENGINE --shapes ...`). Static and dynamic alternate by
round; each figure is the mean over rounds of the median latency. Writes DIR/sequence_profile_bench.json
and prints a table; commit the JSON under bench/results/.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench  # noqa: E402  (run, machine, kiln_bin)
import transformer_bench  # noqa: E402  (bert_module)

NAMES = ["input_ids", "attention_mask"]
MIN_SEQ, OPT_SEQ, MAX_SEQ = 16, 128, 512


def export(path: str) -> None:
    import torch

    if os.path.exists(path):
        return
    module = transformer_bench.bert_module("bert_base")
    ids = torch.randint(0, 30522, (2, 64))
    mask = torch.ones(2, 64, dtype=torch.int64)
    torch.onnx.export(module, (ids, mask), path, dynamo=False, opset_version=17, input_names=NAMES,
                      output_names=["output"],
                      dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in NAMES}, "output": {0: "batch", 1: "sequence"}})


def shapes(batch: int, seq: int) -> list[str]:
    return [f"{n}:{batch}x{seq}" for n in NAMES]


def median_ms(js: str, batch: int, seq: int) -> float:
    """The median latency of a kiln bench JSON, after checking it ran the shapes asked for."""
    with open(js) as f:
        result = json.load(f)["results"][0]
    ran = result["input_shapes"]
    if any(ran[n] != [batch, seq] for n in NAMES):
        raise SystemExit(f"{js}: kiln bench ran {ran}, not {batch}x{seq}")
    return result["latency_ms"]["median"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kiln", default=gpu_bench.kiln_bin())
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seqs", default="64,128,200,384")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = os.path.join(a.out, "work")
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "bert_base_dynamic_sequence.onnx")
    export(model)
    seqs = [int(s) for s in a.seqs.split(",")]

    engine = os.path.join(work, "bert_base_profile.engine")
    t0 = time.time()
    gpu_bench.run([a.kiln, "build", model, "--device", "cuda", "--fp16", "-o", engine,
                   "--min-shapes", *shapes(1, MIN_SEQ), "--opt-shapes", *shapes(a.batch, OPT_SEQ),
                   "--max-shapes", *shapes(a.batch, MAX_SEQ)])
    build_s = time.time() - t0
    print(f"profile engine built in {build_s:.1f} s", flush=True)

    times = {kind: {s: [] for s in seqs} for kind in ("static", "profile")}
    for rnd in range(a.rounds):
        for kind in (("static", "profile") if rnd % 2 == 0 else ("profile", "static")):
            for s in seqs:
                js = os.path.join(work, f"{kind}_{s}_{rnd}.json")
                target = model if kind == "static" else engine
                gpu_bench.run([a.kiln, "bench", target, "--fp16", "--shapes", *shapes(a.batch, s), "--json", js])
                times[kind][s].append(median_ms(js, a.batch, s))
                print(f"round {rnd} {kind:7} seq {s:4}: {times[kind][s][-1]:.3f} ms", flush=True)

    result = {"schema": "kiln.sequence-profile-bench/1", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "machine": gpu_bench.machine(), "kiln": a.kiln, "model": "bert_base", "batch": a.batch,
              "profile": {"min": [1, MIN_SEQ], "opt": [a.batch, OPT_SEQ], "max": [a.batch, MAX_SEQ]},
              "profile_build_s": build_s, "seqs": {}}
    print(f"{'seq':>5} {'static':>10} {'profile':>10} {'ratio':>7}")
    for s in seqs:
        st, dyn = statistics.mean(times["static"][s]), statistics.mean(times["profile"][s])
        result["seqs"][str(s)] = {"static_ms_per_round": times["static"][s], "profile_ms_per_round": times["profile"][s],
                                  "static_mean_ms": st, "profile_mean_ms": dyn, "profile_over_static": dyn / st}
        print(f"{s:>5} {st:10.3f} {dyn:10.3f} {dyn / st:7.3f}")
    with open(os.path.join(a.out, "sequence_profile_bench.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
