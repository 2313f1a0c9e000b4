#!/usr/bin/env python3
"""What compiling the CUDA backend for more GPU architectures costs: each .cu file compiled with
the exact nvcc command of a configured build, once per architecture set, timed in CPU seconds
(user + system of nvcc and the tools it runs: CPU time, unlike wall time, does not grow with
what else the machine runs).

    cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release     # configured; nothing built
    python3 bench/cuda_compile_time.py --build build-cuda --files softmax.cu,int8_conv.cu \
        --sets "90" "80;86;89;90" "80-real;86-real;89-real;90" --out bench/results/cuda_compile_time.json

An architecture "N" embeds SASS and PTX for sm_N, as CMake compiles it; "N-real" SASS only.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time


def generate_code_flags(arch_set: str) -> list[str]:
    flags = []
    for arch in arch_set.split(";"):
        number = arch.split("-")[0]
        code = f"sm_{number}" if arch.endswith("-real") else f"compute_{number},sm_{number}"
        flags.append(f"--generate-code=arch=compute_{number},code=[{code}]")
    return flags


def nvcc_commands(build: str) -> dict[str, list[str]]:
    """{source file name: nvcc argv} of every .cu object of the build."""
    compdb = json.loads(subprocess.run(["ninja", "-C", build, "-t", "compdb"], capture_output=True, text=True,
                                       check=True).stdout)
    out = {}
    for entry in compdb:
        if entry["file"].endswith(".cu") and "nvcc" in entry["command"]:
            out[os.path.basename(entry["file"])] = (entry["directory"], shlex.split(entry["command"]))
    if not out:
        raise SystemExit(f"cuda_compile_time: {build} has no nvcc commands: configure it with the CUDA toolkit installed")
    return out


def compile_once(directory: str, argv: list[str], arch_set: str, obj: str) -> dict:
    args = [a for a in argv if not a.startswith("--generate-code")]
    args = [a for a in args if a not in ("-MD",)]
    for flag in ("-MT", "-MF", "-o"):  # no dependency file; the object into a scratch file
        while flag in args:
            i = args.index(flag)
            del args[i:i + 2]
    args = args[:1] + generate_code_flags(arch_set) + args[1:] + ["-o", obj]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    p = subprocess.run(args, cwd=directory, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"cuda_compile_time: nvcc failed for {arch_set}:\n{p.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "object_bytes": os.path.getsize(obj)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", required=True, help="a CMake build directory configured with the CUDA backend")
    p.add_argument("--files", required=True, help="comma-separated .cu file names (softmax.cu,int8_conv.cu)")
    p.add_argument("--sets", nargs="+", required=True, help='architecture sets, as KILN_CUDA_ARCHITECTURES ("80;86;89;90")')
    p.add_argument("--out", required=True)
    a = p.parse_args()
    commands = nvcc_commands(a.build)
    nvcc = commands[next(iter(commands))][1][0]
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    cpu_model = ""
    with open("/proc/cpuinfo") as f:
        cpu_model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    result = {"schema": "kiln.cuda-compile-time/1", "command": " ".join(["python3", *sys.argv]),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "nvcc": version, "machine": {"cpu": cpu_model, "cores": os.cpu_count(),
                                           "load_average_before": [round(v, 2) for v in os.getloadavg()]},
              "files": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.files.split(","):
            if name not in commands:
                raise SystemExit(f"cuda_compile_time: no .cu file named {name} in {a.build} (there: {sorted(commands)})")
            directory, argv = commands[name]
            result["files"][name] = {}
            for arch_set in a.sets:
                r = compile_once(directory, argv, arch_set, os.path.join(tmp, "x.o"))
                result["files"][name][arch_set] = r
                print(f"{name:<20} {arch_set:<28} {r['cpu_s']:8.1f} CPU s {r['wall_s']:8.1f} s  {r['object_bytes']:>10,} bytes",
                      flush=True)
    base = a.sets[0]
    result["total"] = {s: round(sum(f[s]["cpu_s"] for f in result["files"].values()), 2) for s in a.sets}
    result["total_over_first_set"] = {s: round(result["total"][s] / result["total"][base], 3) for s in a.sets}
    result["machine"]["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print("CPU seconds, all files:", result["total"], "relative to", base, result["total_over_first_set"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
