#!/usr/bin/env python3
"""torch.compile(backend="kiln") against torch.compile's default backend (Inductor), on one GPU.

    python3 bench/torch_backend_bench.py --out FILE [--models resnet50,bert_base] [--iters 100]

Models (random weights, seeded): torchvision's ResNet-50 at 224x224, batches 1 and 32; HF
transformers' BertModel with BERT-base's config, sequence 128 with a quarter of each row
padding (bench/transformer_bench.py's inputs), batches 1 and 8. For each model and batch, on the
same CUDA inputs:
  eager-fp32        the model as written: the reference outputs
  eager-fp16        model.half()
  inductor-fp16     torch.compile(model.half()): the default backend and mode
  kiln              torch.compile(model, backend="kiln"): the float32 model, an fp16 kiln engine
Each is timed as bench/gpu_bench.py times PyTorch (CUDA events around each call, synchronized
after each; median and p99 of --iters calls after 20 warm-up calls), its first call's wall time
(the compile) is recorded, and its output's relative L2 error and cosine against eager-fp32 are
computed. The JSON is rewritten after every measurement, so a run cut short keeps what it did.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

BATCHES = {"resnet50": [1, 32], "bert_base": [1, 8]}


def model_and_inputs(name: str, batch: int):
    import torch
    import torchvision

    if name == "bert_base":
        import transformer_bench

        return transformer_bench.bert_module(name), transformer_bench.inputs_for(name, batch)
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)().eval()
    return model, [torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(batch))]


def compare(got, want) -> dict:
    import torch

    got, want = got.detach().float().flatten().double(), want.detach().float().flatten().double()
    if not torch.isfinite(got).all():
        return {"relative_l2": None, "cosine": None, "finite": False}
    return {"relative_l2": float((got - want).norm() / want.norm()),
            "cosine": float(torch.nn.functional.cosine_similarity(got, want, dim=0)), "finite": True}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--models", default="resnet50,bert_base")
    p.add_argument("--iters", type=int, default=100)
    args = p.parse_args()

    import torch

    import gpu_bench
    import kiln.torch_backend as kiln_torch

    doc = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "machine": gpu_bench.machine(),
           "timing": "CUDA events around each call, synchronized after each; median and p99 in ms", "results": []}

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)

    for name in args.models.split(","):
        for batch in BATCHES[name]:
            model, inputs = model_and_inputs(name, batch)
            model = model.cuda()
            inputs = [x.cuda() for x in inputs]
            half_inputs = [x.half() if x.is_floating_point() else x for x in inputs]
            with torch.no_grad():
                want = model(*inputs)
                half = copy.deepcopy(model).half()  # a copy: the fp32 model stays as it is
                variants = {"eager-fp32": (model, inputs), "eager-fp16": (half, half_inputs)}
                torch._dynamo.reset()
                variants["inductor-fp16"] = (torch.compile(half), half_inputs)
                variants["kiln"] = (torch.compile(model, backend="kiln"), inputs)
                for variant, (fn, xs) in variants.items():
                    print(f"{name} batch {batch}: {variant}", flush=True)
                    start = time.perf_counter()
                    try:
                        out = fn(*xs)
                        torch.cuda.synchronize()
                        first_s = time.perf_counter() - start
                        median, p99 = gpu_bench.time_fn(lambda: fn(*xs), args.iters)
                    except Exception as e:  # a variant that fails is recorded, the others still run
                        doc["results"].append({"model": name, "batch": batch, "variant": variant,
                                               "error": f"{type(e).__name__}: {e}"[:2000]})
                        save()
                        continue
                    row = {"model": name, "batch": batch, "variant": variant, "median_ms": median, "p99_ms": p99,
                           "first_call_s": first_s, "items_per_s": batch * 1000.0 / median, **compare(out, want)}
                    if variant == "kiln":
                        row["kiln_stats"] = dict(kiln_torch.stats)
                    doc["results"].append(row)
                    print(f"  median {median:.4f} ms  p99 {p99:.4f}  first call {first_s:.1f} s  "
                          f"error {row['relative_l2']}", flush=True)
                    save()
            del variants, half, model
            torch.cuda.empty_cache()
    save()


if __name__ == "__main__":
    main()
