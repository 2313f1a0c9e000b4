#!/usr/bin/env python3
"""The GPU gate: the whole GPU suite on the GPU machine, with provenance, and the CI check that
the sources have not changed since the last full GPU run.

CI has no GPU, so what kiln claims of its GPU engine rests on runs of tests/gpu on the lent GPU
machine. This script makes those runs evidence:

  scripts/gpu_gate.py source-hash
      The hashes a GPU run is recorded against: "common", of every file a run depends on
      (SOURCE_PATHS below, as the working tree has them) but the suites' own test files, and one
      per suite, of that suite's test files. A change to one suite's tests asks for that suite
      to run again, a change to kiln for all of them.
  scripts/gpu_gate.py run --out DIR [--suites models,patterns,...] [--gpus N]   (on the GPU machine)
      Unpacks build-gpu/dist/kiln.xz, checks its sha256 against build-gpu/dist/BUILD_INFO.json
      (written by scripts/build_gpu.sh), runs each suite serially with JUnit XML, GPU
      conformance against its floor, and writes DIR/run.json: the commit and source hash the
      binary was built from, the binary's sha256, the GPU, its driver, and per-suite counts. A
      machine call has a time limit, so a full run may be split across calls (--suites), or
      spread over the machine's GPUs (--gpus N: the suites go to N workers, each on one GPU of
      its own, longest first; each worker writes DIR/gpuI, then the suites that need several
      GPUs run in DIR/gpus with all N; `record DIR/gpu*` files them). --workers-per-gpu K puts K
      workers on each GPU (one suite's CPU work beside another's GPU work), and runs the suites
      that measure free device memory after them in DIR/alone. The serving suites take
      KServe and tritonclient from build-gpu/serving-site.tar.xz or .whl/ (carry one;
      scripts/serving_wheels.sh makes both). Before any suite starts it checks what they need
      (the package of build-gpu/pyxz imports; the models suite's Fashion-MNIST test split,
      copied into .data/fashion-mnist and carried) and refuses at once, naming the fix.
  scripts/gpu_gate.py record DIR [DIR...]
      Files each suite's run (JUnit XML, log, counts, hashes) under
      bench/results/gpu-tests/gate/<date>-<commit>-<gpu>/ and rewrites the index (index.json,
      README.md there).
  scripts/gpu_gate.py unverified --reason TEXT
      Records that the current sources were not run on a GPU, and why (the check then passes
      and lists them as unverified, instead of failing).
  scripts/gpu_gate.py check
      Passes when every suite has a recorded run without failures at the current hashes, or an
      unverified entry names the current sources (then it prints what is unverified); fails
      otherwise, naming each suite's state.
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GATE_DIR = os.path.join(ROOT, "bench", "results", "gpu-tests", "gate")
INDEX = os.path.join(GATE_DIR, "index.json")

# What a GPU run depends on: the engine's sources and build, the GPU tests and what they import.
# (The binary itself is identified by its sha256; the scripts that pack it are not sources.)
SOURCE_PATHS = ["CMakeLists.txt", "include", "src", "python", "tests/gpu", "tests/e2e/e2e_models.py",
                "tests/e2e/models.txt", "tests/e2e/test_serve.py", "scripts/export_model.py"]

# Suite -> pytest files (run serially, one pytest process each). "conformance" is kiln's own.
SUITES = {
    "models": ["tests/gpu/test_gpu_models.py", "tests/gpu/test_gpu_real_data.py"],
    "patterns": ["tests/gpu/test_gpu_patterns.py", "tests/gpu/test_gpu_random_chains.py",
                 "tests/gpu/test_gpu_fused_elementwise.py"],
    "dynamic": ["tests/gpu/test_gpu_dynamic.py"],
    "int8": ["tests/gpu/test_gpu_int8.py", "tests/gpu/test_gpu_quantize.py"],
    "python": ["tests/gpu/test_gpu_python.py"],
    "contexts": ["tests/gpu/test_gpu_contexts.py"],
    "serving": ["tests/gpu/test_gpu_serve.py"],
    "multigpu": ["tests/gpu/test_gpu_multi.py"],
    "partition": ["tests/gpu/test_gpu_partition.py"],
    "detection": ["tests/gpu/test_gpu_detection.py"],
    "tools": ["tests/gpu/test_gpu_tools.py"],
    "conformance": [],
}
# Suites that need more than one GPU in view: `run --gpus N` runs them after the one-GPU workers,
# in one worker that sees all N GPUs (and all cores); a plain `run` gives them what it sees.
SUITE_GPUS = {"multigpu": 2}
# Suites that measure the device's free memory (cudaMemGetInfo: engine and context footprints,
# leak soaks), which another process on the same GPU would move: with --workers-per-gpu above 1
# they run after the shared workers, alone.
SUITE_ALONE = ("contexts",)
# The serving suites' packages (KServe, Triton's client), which the GPU machine lacks:
# scripts/serving_wheels.sh fetches them into .whl/ and packs them installed into
# build-gpu/serving-site.tar.xz; `run` unpacks or installs them into a folder of its own.
SERVING_SUITES = ("serving", "multigpu")
WHEELS = os.path.join(ROOT, ".whl")
# GPU conformance on onnx's node cases: at least this many pass and none fails. Raise the floor
# as coverage grows; CONFORMANCE_ONNX is the onnx version whose cases the floor counts.
CONFORMANCE_FLOOR = 1530
CONFORMANCE_ONNX = "1.23"
# The case the CPU engine's results differ from by two units in the last place (a float16
# attention expanded into MatMul and Softmax: kiln sums in float32, closer to exact), which the
# CPU conformance test leaves out too (tests/cli/CMakeLists.txt, conformance_onnx_pypi_node_cases):
# left out of the partitioned GPU run, where the CPU engine runs those nodes.
CPU_KNOWN_DIFFERENCES = r"^(?!node/test_attention_4d_causal_fp16_expanded$).*"
# About how long each suite runs alone on an H100 (seconds): how --gpus balances the workers.
# Beside three others on a four-GPU machine a suite runs 1.2 to 1.4 times longer.
SUITE_SECONDS = {"int8": 420, "contexts": 330, "models": 290, "dynamic": 240, "patterns": 175, "python": 80,
                 "serving": 90, "multigpu": 90, "partition": 90, "detection": 420, "tools": 60,
                 "conformance": 40}


def source_files() -> list[str]:
    try:
        # Tracked files and untracked ones git does not ignore: what a build compiles (CMake globs
        # src/) and what a device call uploads, so a file not yet added counts as it will once it is.
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SOURCE_PATHS],
                             cwd=ROOT, capture_output=True, check=True).stdout.decode()
        files = [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for path in SOURCE_PATHS:
            full = os.path.join(ROOT, path)
            if os.path.isfile(full):
                files.append(path)
            for dirpath, dirnames, filenames in os.walk(full):
                dirnames[:] = [d for d in dirnames if d != "__pycache__"]
                files += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in filenames if not f.endswith(".pyc")]
    return sorted(f for f in files if os.path.isfile(os.path.join(ROOT, f)))


def hash_files(files: list[str]) -> str:
    """sha256 over (path, content sha256) of each file, as the working tree has it."""
    h = hashlib.sha256()
    for f in sorted(files):
        with open(os.path.join(ROOT, f), "rb") as fh:
            h.update(f.encode() + b"\0" + hashlib.sha256(fh.read()).hexdigest().encode() + b"\n")
    return h.hexdigest()


def source_hashes() -> dict:
    suite_files = {f for files in SUITES.values() for f in files}
    return {"common": hash_files([f for f in source_files() if f not in suite_files]),
            "suites": {suite: hash_files(files) for suite, files in SUITES.items()}}


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def git_commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *SOURCE_PATHS], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# --- run (on the GPU machine) -----------------------------------------------------------------

def gpu_identity() -> dict:
    query = "name,driver_version,memory.total"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                         text=True)
    if out.returncode != 0 or not out.stdout.strip():
        sys.exit(f"gpu_gate: nvidia-smi failed: {out.stderr.strip()} (is this the GPU machine?)")
    name, driver, memory = [x.strip() for x in out.stdout.strip().splitlines()[0].split(",")]
    return {"gpu": name, "driver": driver, "memory": memory}


def unpack_binary() -> tuple[str, dict]:
    dist = os.path.join(ROOT, "build-gpu", "dist")
    info_path = os.path.join(dist, "BUILD_INFO.json")
    if not os.path.exists(info_path):
        sys.exit("gpu_gate: build-gpu/dist/BUILD_INFO.json is missing: build with scripts/build_gpu.sh and carry build-gpu/dist")
    with open(info_path) as f:
        info = json.load(f)
    binary = os.path.join(ROOT, "build-gpu", "kiln")
    # Written beside, then renamed over: workers on other GPUs may be running the binary.
    partial = f"{binary}.{os.getpid()}"
    with lzma.open(os.path.join(dist, "kiln.xz")) as src, open(partial, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.chmod(partial, 0o755)
    os.replace(partial, binary)
    digest = sha256_file(binary)
    if digest != info["binary_sha256"]:
        sys.exit(f"gpu_gate: build-gpu/kiln has sha256 {digest}, BUILD_INFO.json says {info['binary_sha256']}")
    return binary, info


def junit_counts(path: str) -> dict:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    if not os.path.exists(path):
        counts["errors"] = 1
        counts["failures"].append("no JUnit XML written (pytest did not start?)")
        return counts
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            counts["failed"] += 1
            counts["failures"].append(name)
        elif case.find("error") is not None:
            counts["errors"] += 1
            counts["failures"].append(name)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def conformance_summary(kiln: str, cases: str, out: str, env: dict, name: str, extra: list[str]) -> dict | None:
    """Runs `kiln conformance --device cuda` with `extra` flags; writes NAME.log and junit-NAME.xml
    (unsupported cases as skipped ones, like the pytest suites) and returns the JSON summary."""
    summary_path = os.path.join(out, f"{name}.json")
    with open(os.path.join(out, f"{name}.log"), "w") as log:
        subprocess.run([kiln, "conformance", cases, "--device", "cuda", "--json", summary_path, *extra], cwd=ROOT, env=env,
                       stdout=log, stderr=subprocess.STDOUT)
    if not os.path.exists(summary_path):
        return None
    with open(summary_path) as f:
        summary = json.load(f)
    suite = ET.Element("testsuite", name=name)
    for c in summary["cases"]:
        case = ET.SubElement(suite, "testcase", classname="conformance", name=c["name"])
        if c["status"] == "FAIL":
            ET.SubElement(case, "failure", message=c["reason"][:2000])
        elif c["status"] == "UNSUPPORTED":
            ET.SubElement(case, "skipped", message=c["reason"][:500])
    junit = "junit-conformance.xml" if name == "conformance_gpu" else f"junit-{name.replace('_', '-')}.xml"
    ET.ElementTree(suite).write(os.path.join(out, junit), encoding="unicode")
    return summary


def run_conformance(kiln: str, out: str, env: dict) -> dict:
    """GPU conformance twice: the GPU's own layers (--strict builds; the floor counts these) and
    as GPU builds run by default, nodes without a GPU layer on the CPU engine (no case may fail
    either way)."""
    cases = "/tmp/onnx-node-tests"
    if not os.path.isdir(os.path.join(cases, "node")):
        subprocess.run([sys.executable, "src/tools/generate_node_tests.py", "-o", cases], cwd=ROOT, env=env,
                       check=True, stdout=subprocess.DEVNULL)
    own = conformance_summary(kiln, cases, out, env, "conformance_gpu", [])
    partitioned = conformance_summary(kiln, cases, out, env, "conformance_gpu_partitioned",
                                      ["--allow-cpu-fallback", "--filter", CPU_KNOWN_DIFFERENCES])
    if own is None or partitioned is None:
        return {"passed": 0, "failed": 0, "errors": 1, "skipped": 0, "failures": ["kiln conformance wrote no summary"]}
    counts = {"passed": own["pass"], "failed": own["fail"] + partitioned["fail"], "errors": 0, "skipped": own["unsupported"],
              "failures": [c["name"] for c in own["cases"] if c["status"] == "FAIL"] +
                          [c["name"] + " (partitioned)" for c in partitioned["cases"] if c["status"] == "FAIL"],
              "partitioned_passed": partitioned["pass"], "partitioned_with_cpu_fallback": partitioned["pass_with_cpu_fallback"]}
    if own["pass"] < CONFORMANCE_FLOOR:
        counts["errors"] += 1
        counts["failures"].append(f"{own['pass']} cases passed, below the floor of {CONFORMANCE_FLOOR}")
    import onnx  # noqa: PLC0415  (the machine's onnx: the cases' version)
    counts["onnx"] = onnx.__version__
    return counts


def split_suites(suites: list[str], workers: int) -> list[list[str]]:
    """The suites in `workers` groups of about equal expected time (longest first, each to the
    group that ends soonest)."""
    groups: list[list[str]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for suite in sorted(suites, key=lambda s: -SUITE_SECONDS.get(s, 300)):
        i = load.index(min(load))
        groups[i].append(suite)
        load[i] += SUITE_SECONDS.get(suite, 300)
    return [g for g in groups if g]


def suite_environment(kiln: str, suites: list[str]) -> dict:
    """The environment the suites run in: the unpacked binary, the GPU build of the Python package
    (and the serving packages where a serving suite runs), cuDNN from torch's wheel."""
    python_path = [os.path.join(ROOT, "build-gpu", "python")]
    if any(s in SERVING_SUITES for s in suites):
        python_path.append(serving_site())
    env = dict(os.environ, KILN_BIN=kiln, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(p for p in python_path if p))
    try:
        import nvidia.cudnn  # noqa: PLC0415
        cudnn = os.path.join(nvidia.cudnn.__path__[0], "lib")
    except ImportError:
        cudnn = ""
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (cudnn, "/usr/local/cuda/lib64", env.get("LD_LIBRARY_PATH", "")) if p)
    return env


# The Fashion-MNIST test split the models suite reads (tests/gpu/test_gpu_real_data.py's places).
FASHION_MNIST_FILES = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def fashion_mnist_folders(env: dict) -> list[str]:
    return [f for f in (env.get("KILN_FASHION_MNIST", ""), "/usr/share/datasets/fashion-mnist",
                        os.path.join(ROOT, ".data", "fashion-mnist")) if f]


def unready_reasons(suites: list[str], env: dict) -> list[str]:
    """What the suites need that this machine lacks, each with the fix: found before any suite
    runs, so a missing carry costs seconds of device time, not a whole suite's."""
    reasons = []
    if any(s != "conformance" for s in suites):  # every pytest suite imports the package
        r = subprocess.run([sys.executable, "-c", "import kiln"], env=env, cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
            reasons.append(f"the kiln package does not import ({last}): rebuild it with scripts/build_gpu_python.sh "
                           "and carry build-gpu/pyxz")
    if "models" in suites and not any(all(os.path.exists(os.path.join(folder, name)) for name in FASHION_MNIST_FILES)
                                      for folder in fashion_mnist_folders(env)):
        reasons.append(f"the models suite reads Fashion-MNIST's test split ({', '.join(FASHION_MNIST_FILES)}), in none "
                       f"of {fashion_mnist_folders(env)}: copy it from /usr/share/datasets/fashion-mnist into "
                       ".data/fashion-mnist and carry .data")
    return reasons


def refuse_unless_ready(suites: list[str], env: dict) -> None:
    reasons = unready_reasons(suites, env)
    if reasons:
        sys.exit("gpu_gate: not run: " + "; ".join(reasons))


def run_on_gpus(out: str, suites: list[str], gpus: int, per_gpu: int = 1) -> int:
    """per_gpu worker processes per GPU (CUDA_VISIBLE_DEVICES), each running its group of suites
    into out/gpuI with a model cache and pytest temporary folder of its own, on a share of the CPU
    cores of its own (the suites' CPU references use every core they see: unpinned, four workers
    ran each suite 1.4 times slower than one worker alone). Workers sharing a GPU overlap one
    suite's exports, CPU references and builds with another's GPU work; the suites that measure
    the device's free memory then run after them, alone."""
    kiln, _ = unpack_binary()  # once, checked, before the workers start
    refuse_unless_ready(suites, suite_environment(kiln, suites))
    several = [s for s in suites if SUITE_GPUS.get(s, 1) > 1]
    alone = [s for s in suites if per_gpu > 1 and s in SUITE_ALONE and s not in several]
    groups = split_suites([s for s in suites if s not in several and s not in alone], gpus * per_gpu)
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // max(1, len(groups)))
    workers = []
    for i, group in enumerate(groups):
        mine = set(cores[i * share:(i + 1) * share]) or set(cores)
        threads = str(len(mine))
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(i % gpus), OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads,
                   MKL_NUM_THREADS=threads,
                   KILN_MODEL_CACHE=os.path.join(ROOT, "tests", "e2e", ".models", f"gate-gpu{i}"))
        log = open(os.path.join(out, f"gpu{i}.log"), "w")
        print(f"==> worker {i}, GPU {i % gpus}: {', '.join(group)}", flush=True)
        workers.append((i, log, subprocess.Popen([sys.executable, os.path.abspath(__file__), "run", "--out",
                                                  os.path.join(out, f"gpu{i}"), "--suites", ",".join(group)],
                                                 env=env, stdout=log, stderr=subprocess.STDOUT,
                                                 preexec_fn=lambda mine=mine: os.sched_setaffinity(0, mine))))
    status = 0
    for i, log, proc in workers:
        status |= proc.wait() != 0
        log.close()
        with open(log.name) as f:
            print(f"--- worker {i}\n{f.read()}", end="", flush=True)
    # Then, one after the other with the machine to themselves: the suites that measure free
    # device memory (on the GPUs as the caller sees them), and those that need every GPU.
    for name, apart, visible in (("alone", alone, None), ("gpus", several, ",".join(str(i) for i in range(gpus)))):
        if not apart:
            continue
        print(f"==> {name}: {', '.join(apart)}", flush=True)
        env = dict(os.environ, KILN_MODEL_CACHE=os.path.join(ROOT, "tests", "e2e", ".models", f"gate-{name}"))
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        status |= subprocess.run([sys.executable, os.path.abspath(__file__), "run", "--out", os.path.join(out, name),
                                  "--suites", ",".join(apart)], env=env).returncode != 0
    return status


def serving_site() -> str:
    """The serving suites' packages in a folder of their own, once per machine: a folder there
    before (with its .done mark) as it is, else build-gpu/serving-site.tar.xz unpacked, else the
    wheels of .whl/ installed (scripts/serving_wheels.sh makes both); "" when none is there (the
    suites then fail on the missing package)."""
    site = "/tmp/kiln-gate-serving-site"
    if os.path.exists(os.path.join(site, ".done")):
        return site
    packed = os.path.join(ROOT, "build-gpu", "serving-site.tar.xz")
    if os.path.exists(packed):
        subprocess.run(["tar", "xJf", packed, "-C", os.path.dirname(site)], check=True)
        return site
    if not os.path.isdir(WHEELS):
        return ""
    wheels = sorted(os.path.join(WHEELS, w) for w in os.listdir(WHEELS) if w.endswith(".whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", site, *wheels], check=True)
    open(os.path.join(site, ".done"), "w").close()
    return site


def cmd_run(args) -> int:
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    if args.gpus > 1 or args.workers_per_gpu > 1:
        suites = args.suites.split(",") if args.suites else list(SUITES)
        for suite in suites:
            if suite not in SUITES:
                sys.exit(f"gpu_gate: unknown suite '{suite}' (suites: {', '.join(SUITES)})")
        return run_on_gpus(out, suites, args.gpus, args.workers_per_gpu)
    kiln, build = unpack_binary()
    identity = gpu_identity()
    suites = args.suites.split(",") if args.suites else list(SUITES)
    env = suite_environment(kiln, suites)
    refuse_unless_ready(suites, env)
    version = subprocess.run([kiln, "--version"], capture_output=True, text=True, env=env).stdout.strip()
    run = {"schema": "kiln.gpu-gate/1", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           **identity, "kiln_version": version, "commit": build["commit"], "common_hash": build["common_hash"],
           "binary_sha256": build["binary_sha256"], "suites": {}}
    # The suites' own test files as this machine has them (the copy of the tree that runs).
    suite_hashes = {suite: hash_files(files) for suite, files in SUITES.items()}
    status = 0
    for suite in suites:
        if suite not in SUITES:
            sys.exit(f"gpu_gate: unknown suite '{suite}' (suites: {', '.join(SUITES)})")
        print(f"==> {suite}", flush=True)
        t0 = time.monotonic()
        if suite == "conformance":
            counts = run_conformance(kiln, out, env)
        else:
            junit = os.path.join(out, f"junit-{suite}.xml")
            with open(os.path.join(out, f"{suite}.log"), "w") as log:
                subprocess.run([sys.executable, "-m", "pytest", *SUITES[suite], "-v", "-rf", "-p", "no:cacheprovider",
                                f"--basetemp=/tmp/kiln-gate-{os.getpid()}-{suite}", "--timeout", "900", f"--junitxml={junit}", "-o", "junit_family=xunit2"],
                               cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            counts = junit_counts(junit)
        counts["seconds"] = round(time.monotonic() - t0, 1)
        counts["suite_hash"] = suite_hashes[suite]
        run["suites"][suite] = counts
        bad = counts["failed"] + counts["errors"]
        status |= bad > 0
        print(f"    {counts['passed']} passed, {counts['failed']} failed, {counts['errors']} errors, "
              f"{counts['skipped']} skipped in {counts['seconds']} s" +
              "".join(f"\n    FAILED {name}" for name in counts["failures"][:20]), flush=True)
        with open(os.path.join(out, "run.json"), "w") as f:  # after each suite: a time limit keeps what ran
            json.dump(run, f, indent=1)
    return status


# --- record, unverified, check (on the development machine and in CI) -------------------------

def load_index() -> dict:
    if os.path.exists(INDEX):
        with open(INDEX) as f:
            return json.load(f)
    return {"schema": "kiln.gpu-gate-index/1", "runs": [], "unverified": []}


def passed(run: dict) -> bool:
    return run["failed"] == 0 and run["errors"] == 0


def write_index(index: dict) -> None:
    os.makedirs(GATE_DIR, exist_ok=True)
    index["runs"].sort(key=lambda r: (r["date"], r["suite"]))
    with open(INDEX, "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    lines = ["# GPU gate runs", "",
             "Written by `python3 scripts/gpu_gate.py record` from runs of `scripts/gpu_gate.py run` on the GPU machine",
             "(each suite of tests/gpu serially, with JUnit XML; GPU conformance with a floor of "
             f"{CONFORMANCE_FLOOR} passing cases of onnx {CONFORMANCE_ONNX}'s node tests).",
             "`scripts/gpu_gate.py check` (the CTest gpu_gate_check) passes when every suite has a run without",
             "failures at the current hashes: `common` (kiln's sources and what every suite imports) and the suite's",
             "own test files. Newest first.", "",
             "| date | suite | passed | failed | skipped | seconds | GPU | driver | commit | binary sha256 | common | suite files | folder |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in reversed(index["runs"]):
        lines.append(f"| {r['date'][:10]} | {r['suite']} | {r['passed']} | {r['failed'] + r['errors']} | {r['skipped']} | "
                     f"{r['seconds']} | {r['gpu']} | {r['driver']} | {r['commit'][:12]} | {r['binary_sha256'][:12]} | "
                     f"{r['common_hash'][:12]} | {r['suite_hash'][:12]} | [{r['dir']}]({r['dir']}/) |")
    if index["unverified"]:
        lines += ["", "## Sources not run on a GPU", "", "| date | common hash | reason |", "| --- | --- | --- |"]
        lines += [f"| {u['date'][:10]} | {u['common_hash'][:12]} | {u['reason']} |" for u in reversed(index["unverified"])]
    with open(os.path.join(GATE_DIR, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


RECORD_COMPRESS_ABOVE = 64 * 1024


def read_record(path: str) -> bytes:
    """A recorded log or JUnit file's bytes, whether it was kept plain or gzip-compressed."""
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()


def cmd_record(args) -> int:
    index = load_index()
    for d in args.dirs:
        with open(os.path.join(d, "run.json")) as f:
            run = json.load(f)
        slug = re.sub(r"[^A-Za-z0-9]+", "-", run["gpu"]).strip("-").lower()
        folder = f"{run['date'][:10]}-{run['commit'][:10]}-{slug}"
        dest = os.path.join(GATE_DIR, folder)
        os.makedirs(dest, exist_ok=True)
        for suite, counts in run["suites"].items():
            entry = {"suite": suite, "date": run["date"], "dir": folder,
                     **{k: run[k] for k in ("gpu", "driver", "kiln_version", "commit", "common_hash", "binary_sha256")},
                     **{k: counts[k] for k in ("passed", "failed", "errors", "skipped", "seconds", "suite_hash")},
                     "failures": counts["failures"][:50]}
            for extra in ("onnx", "partitioned_passed", "partitioned_with_cpu_fallback"):
                if extra in counts:
                    entry[extra] = counts[extra]
            index["runs"] = [r for r in index["runs"] if not (r["suite"] == suite and r["date"] == run["date"] and
                                                               r["binary_sha256"] == run["binary_sha256"])]
            index["runs"].append(entry)
            print(f"recorded {suite} ({folder}): {counts['passed']} passed, {counts['failed'] + counts['errors']} failed")
        # Runs of one day, commit and GPU share a folder: each run's summary is named by its start
        # time and suites (workers of one --gpus run start together), and a suite's JUnit XML or
        # log that another run left there already is kept, this run's named by its time.
        # Logs and JUnit files above RECORD_COMPRESS_ABOVE bytes are kept gzip-compressed (the
        # conformance ones are hundreds of KB each, and every GPU call uploads the whole tree).
        clock = run["date"][11:19].replace(":", "")
        for name in os.listdir(d):
            if name.startswith("junit-") or name.endswith(".log") or name == "run.json":
                source = os.path.join(d, name)
                with open(source, "rb") as f:
                    data = f.read()
                target = name if name != "run.json" else f"run-{clock}-{'-'.join(run['suites'])}.json"
                compress = name != "run.json" and len(data) > RECORD_COMPRESS_ABOVE
                if compress:
                    target += ".gz"
                if name != "run.json" and os.path.exists(os.path.join(dest, target)):
                    if read_record(os.path.join(dest, target)) != data:
                        stem, ext = os.path.splitext(name)
                        target = f"{stem}-{clock}{ext}" + (".gz" if compress else "")
                if compress:
                    with gzip.GzipFile(os.path.join(dest, target), "wb", mtime=0) as f:
                        f.write(data)
                else:
                    shutil.copy(source, os.path.join(dest, target))
    write_index(index)
    return 0


def cmd_unverified(args) -> int:
    index = load_index()
    common = source_hashes()["common"]
    index["unverified"] = [u for u in index["unverified"] if u["common_hash"] != common]
    index["unverified"].append({"date": datetime.date.today().isoformat(), "common_hash": common, "commit_base": git_commit(),
                                "reason": args.reason})
    write_index(index)
    print(f"sources {common[:12]} recorded as not run on a GPU: {args.reason}")
    return 0


def cmd_check(args) -> int:
    index = load_index()
    hashes = source_hashes()
    common = hashes["common"]
    missing = []
    for suite, suite_hash in hashes["suites"].items():
        ok = [r for r in index["runs"] if r["suite"] == suite and r["common_hash"] == common and
              r["suite_hash"] == suite_hash and passed(r)]
        if ok:
            r = ok[-1]
            print(f"gpu gate: {suite}: {r['passed']} passed on {r['gpu']} on {r['date'][:10]} ({r['dir']})")
            continue
        last = [r for r in index["runs"] if r["suite"] == suite and passed(r)]
        missing.append(f"{suite}: no run without failures at these sources" +
                       (f" (last: {last[-1]['date'][:10]}, commit {last[-1]['commit'][:12]})" if last else " (none on record)"))
    if not missing:
        print(f"gpu gate: every suite passed on a GPU at these sources (common {common[:12]})")
        return 0
    mentioned = [u for u in index["unverified"] if u["common_hash"] == common]
    if mentioned:
        print(f"gpu gate: UNVERIFIED on a GPU (common {common[:12]}): {mentioned[-1]['reason']}")
        for m in missing:
            print(f"  {m}")
        return 0
    print(f"gpu gate: FAILED: the sources (common {common[:12]}) differ from what ran on a GPU:\n  " + "\n  ".join(missing) +
          "\nRun the suites on the GPU machine (scripts/build_gpu.sh; scripts/gpu_gate.py run there; then "
          "scripts/gpu_gate.py record), or say why they cannot run: scripts/gpu_gate.py unverified --reason '...'.",
          file=sys.stderr)
    return 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("source-hash")
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--suites", default="", help=f"comma-separated, of: {', '.join(SUITES)} (default: all)")
    r.add_argument("--gpus", type=int, default=1, help="spread the suites over this many GPUs, one worker each")
    r.add_argument("--workers-per-gpu", type=int, default=1,
                   help="this many workers share each GPU (suites in SUITE_ALONE then run after them, alone)")
    rec = sub.add_parser("record")
    rec.add_argument("dirs", nargs="+")
    u = sub.add_parser("unverified")
    u.add_argument("--reason", required=True)
    sub.add_parser("check")
    args = p.parse_args()
    if args.command == "source-hash":
        print(json.dumps(source_hashes(), indent=1))
        return 0
    return {"run": cmd_run, "record": cmd_record, "unverified": cmd_unverified, "check": cmd_check}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
