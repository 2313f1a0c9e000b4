#!/usr/bin/env python3
"""Host-to-device copy rate on the GPU machine: what bounds a server whose inputs come from host
memory. Copies of --mb MB to GPU 0 from memory cudaHostAlloc'd (torch's pin_memory), from an mmap
registered with cudaHostRegister (kiln.PinnedHostMemory: what `kiln serve` does with shared-memory
regions) and from pageable memory, on 1 and on --streams streams at once; GB/s of each, as the
median of --repeats timed rounds. Writes JSON to --out.

    source scripts/gpu_env.sh && python3 bench/h2d_bandwidth.py --out h2d.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import mmap
import subprocess
import time

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--mb", type=int, default=64)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    import torch

    import kiln

    nbytes = args.mb << 20
    device = torch.empty(args.streams * nbytes, dtype=torch.uint8, device="cuda:0")
    region = mmap.mmap(-1, args.streams * nbytes)
    pin = kiln.PinnedHostMemory(region)
    sources = {
        "cudaHostAlloc": torch.empty(args.streams * nbytes, dtype=torch.uint8).pin_memory(),
        "cudaHostRegister (mmap)": torch.frombuffer(pin, dtype=torch.uint8),
        "pageable": torch.empty(args.streams * nbytes, dtype=torch.uint8),
    }
    streams = [torch.cuda.Stream() for _ in range(args.streams)]
    rows = []
    for name, host in sources.items():
        host.fill_(1)
        for n in (1, args.streams):
            rates = []
            for _ in range(args.repeats):
                torch.cuda.synchronize()
                start = time.perf_counter()
                for i in range(n):
                    with torch.cuda.stream(streams[i]):
                        device[i * nbytes:(i + 1) * nbytes].copy_(host[i * nbytes:(i + 1) * nbytes], non_blocking=True)
                torch.cuda.synchronize()
                rates.append(n * nbytes / (time.perf_counter() - start) / 1e9)
            rows.append({"source": name, "streams": n, "mb_per_stream": args.mb, "gb_per_s": float(np.median(rates))})
            print(f"{name:26s} {n} stream(s): {rows[-1]['gb_per_s']:.1f} GB/s", flush=True)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    with open(args.out, "w") as f:
        json.dump({"benchmark": "host-to-device copy rate", "command": "python3 bench/h2d_bandwidth.py " +
                   " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "gpu": gpu, "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
