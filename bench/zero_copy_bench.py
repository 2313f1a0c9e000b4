#!/usr/bin/env python3
"""What a run of a kiln GPU context costs with its inputs and outputs in the caller's memory
(Context.bind / set_tensor_address) against copies through the context's own buffers, on one GPU.

    python3 bench/zero_copy_bench.py --out FILE [--models resnet50,bert_base] [--iters 200]

Models as bench/torch_backend_bench.py builds them (random weights, seeded), exported with
torch.onnx (TorchScript exporter, opset 17) and built as fp16 kiln engines for one shape. On the
same engine and inputs, each call on torch's current stream:
  copy          the input copied into the context's buffer, a run, the output cloned out of its
                buffer: the copies that binding saves
  bound         the caller's input and output tensors bound once: a run alone
  alternating   two output tensors bound in turn (torch's allocator hands a loop's outputs out
                so): from the third call each address set replays a graph of its own
  rotation-6    each call binds one of 6 output tensors in turn: more sets than the 4 graphs a
                shape keeps, few enough to be met again lately; three replay graphs of their
                own (the fourth graph is the context's buffers'), the others copy through them
  new-address   each call binds one of 16 output tensors in turn, more sets of addresses than a
                context remembers: every call copies through the context's buffers
  fresh-output  a new output tensor from torch's allocator every call, bound (what the
                torch.compile backend does)
Each is timed as bench/gpu_bench.py times PyTorch (CUDA events around each call, synchronized
after each; median and p99 of --iters calls after 20 warm-up calls), and its output is compared
with the copy variant's (max abs difference; the same engine, so 0 is expected).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

BATCHES = {"resnet50": [1, 32], "bert_base": [1]}


def build_engine(model, inputs, folder: str):
    import torch

    import kiln

    path = os.path.join(folder, "model.onnx")
    names = [f"input{i}" for i in range(len(inputs))]
    with torch.no_grad():
        torch.onnx.export(model, tuple(inputs), path, input_names=names, output_names=["output"], opset_version=17,
                          dynamo=False)
    shapes = {n: list(x.shape) for n, x in zip(names, inputs)}
    return kiln.Builder(precision="fp16", device="cuda", shapes=shapes).build(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--models", default="resnet50,bert_base")
    p.add_argument("--iters", type=int, default=200)
    args = p.parse_args()

    import torch

    import gpu_bench
    from torch_backend_bench import model_and_inputs

    doc = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "machine": gpu_bench.machine(),
           "timing": "CUDA events around each call on torch's current stream, synchronized after each; median and "
                     "p99 in ms", "results": []}

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)

    for name in args.models.split(","):
        for batch in BATCHES[name]:
            print(f"{name} batch {batch}: export and build", flush=True)
            model, inputs = model_and_inputs(name, batch)
            with tempfile.TemporaryDirectory(prefix="kiln-zero-copy-") as folder:
                engine = build_engine(model, inputs, folder)
            inputs = [x.cuda() for x in inputs]
            context = engine.create_context()
            names = [d.name for d in engine.inputs]
            shape = context.output_shape("output")
            own_in = [torch.from_dlpack(context.input_dlpack(engine, n)) for n in names]
            own_out = torch.from_dlpack(context.output_dlpack(engine, "output"))

            def stream() -> int:
                return torch.cuda.current_stream().cuda_stream

            def bind_inputs() -> None:
                for n, x in zip(names, inputs):
                    context.bind(n, x)

            def unbind_all() -> None:
                for n in [*names, "output"]:
                    context.unbind(n)

            def copy_run():
                for buffer, x in zip(own_in, inputs):
                    buffer.copy_(x, non_blocking=True)
                context.enqueue(stream())
                return own_out.clone()

            bound_out = torch.empty(shape, device="cuda")
            pair = [torch.empty(shape, device="cuda") for _ in range(2)]
            six = [torch.empty(shape, device="cuda") for _ in range(6)]
            many = [torch.empty(shape, device="cuda") for _ in range(16)]
            turn = [0]

            def bound_run():
                context.enqueue(stream())
                return bound_out

            def in_turn(outputs):
                def run():
                    out = outputs[turn[0] % len(outputs)]
                    turn[0] += 1
                    context.set_tensor_address("output", out.data_ptr(), out.numel() * out.element_size())
                    context.enqueue(stream())
                    return out
                return run

            def fresh_run():
                out = torch.empty(shape, device="cuda")
                context.set_tensor_address("output", out.data_ptr(), out.numel() * out.element_size())
                context.enqueue(stream())
                return out

            variants = [("copy", copy_run), ("bound", bound_run), ("alternating", in_turn(pair)),
                        ("rotation-6", in_turn(six)), ("new-address", in_turn(many)), ("fresh-output", fresh_run)]
            reference = None
            for variant, fn in variants:
                if variant == "copy":
                    unbind_all()
                else:
                    bind_inputs()
                    context.bind("output", bound_out)
                print(f"  {variant}", flush=True)
                out = fn().clone()
                torch.cuda.synchronize()
                reference = out if reference is None else reference
                median, p99 = gpu_bench.time_fn(fn, args.iters)
                row = {"model": name, "batch": batch, "variant": variant, "median_ms": median, "p99_ms": p99,
                       "max_abs_diff_vs_copy": float((out.float() - reference.float()).abs().max())}
                doc["results"].append(row)
                print(f"    median {median:.4f} ms  p99 {p99:.4f}  diff {row['max_abs_diff_vs_copy']}", flush=True)
                save()
            unbind_all()
            del context, engine, own_in, own_out
            torch.cuda.empty_cache()
    save()


if __name__ == "__main__":
    main()
