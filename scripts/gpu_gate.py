#!/usr/bin/env python3
"""The GPU gate: the whole GPU suite on the GPU machine, with provenance, and the CI check that
the sources have not changed since the last full GPU run.

CI has no GPU, so what kiln claims of its GPU engine rests on runs of tests/gpu on the lent GPU
machine. This script makes those runs evidence:

  scripts/gpu_gate.py source-hash
      The hash of every file a GPU run depends on (SOURCE_PATHS below, as the working tree has
      them): what a run is recorded against, and what the check compares.
  scripts/gpu_gate.py run --out DIR [--suites models,patterns,...]       (on the GPU machine)
      Unpacks build-gpu/dist/kiln.xz, checks its sha256 against build-gpu/dist/BUILD_INFO.json
      (written by scripts/build_gpu.sh), runs each suite serially with JUnit XML, GPU
      conformance against its floor, and writes DIR/run.json: the commit and source hash the
      binary was built from, the binary's sha256, the GPU, its driver, and per-suite counts. A
      machine call has a time limit, so a full run may be split across calls (--suites).
  scripts/gpu_gate.py record DIR [DIR...]
      Files the runs of one binary under bench/results/gpu-tests/gate/<date>-<commit>-<gpu>/ and
      rewrites the index (index.json, README.md there). A record is full when every suite ran
      and nothing failed.
  scripts/gpu_gate.py unverified --reason TEXT
      Records that the current sources were not run on a GPU, and why (the check then passes
      and lists them as unverified, instead of failing).
  scripts/gpu_gate.py check
      Passes when a full record has the current source hash, or an unverified entry names it
      (then it prints what is unverified); fails otherwise, naming the last full run.
"""
from __future__ import annotations

import argparse
import datetime
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
SOURCE_PATHS = ["CMakeLists.txt", "include", "src", "python", "tests/gpu", "tests/e2e/e2e_models.py",
                "tests/e2e/models.txt", "scripts/export_model.py", "scripts/build_gpu.sh",
                "scripts/build_gpu_python.sh"]

# Suite -> pytest files (run serially, one pytest process each). "conformance" is kiln's own.
SUITES = {
    "models": ["tests/gpu/test_gpu_models.py"],
    "patterns": ["tests/gpu/test_gpu_patterns.py"],
    "dynamic": ["tests/gpu/test_gpu_dynamic.py"],
    "int8": ["tests/gpu/test_gpu_int8.py", "tests/gpu/test_gpu_quantize.py"],
    "python": ["tests/gpu/test_gpu_python.py", "tests/gpu/test_gpu_contexts.py"],
    "conformance": [],
}
# GPU conformance on onnx's node cases: at least this many pass and none fails. Raise the floor
# as coverage grows; CONFORMANCE_ONNX is the onnx version whose cases the floor counts.
CONFORMANCE_FLOOR = 823
CONFORMANCE_ONNX = "1.23"


def source_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *SOURCE_PATHS], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode()
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


def source_hash() -> str:
    """sha256 over (path, content sha256) of every source file, as the working tree has them."""
    h = hashlib.sha256()
    for f in source_files():
        with open(os.path.join(ROOT, f), "rb") as fh:
            h.update(f.encode() + b"\0" + hashlib.sha256(fh.read()).hexdigest().encode() + b"\n")
    return h.hexdigest()


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
    with lzma.open(os.path.join(dist, "kiln.xz")) as src, open(binary, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.chmod(binary, 0o755)
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


def run_conformance(kiln: str, out: str, env: dict) -> dict:
    cases = "/tmp/onnx-node-tests"
    if not os.path.isdir(os.path.join(cases, "node")):
        subprocess.run([sys.executable, "src/tools/generate_node_tests.py", "-o", cases], cwd=ROOT, env=env,
                       check=True, stdout=subprocess.DEVNULL)
    summary_path = os.path.join(out, "conformance_gpu.json")
    with open(os.path.join(out, "conformance_gpu.log"), "w") as log:
        subprocess.run([kiln, "conformance", cases, "--device", "cuda", "--json", summary_path], cwd=ROOT, env=env,
                       stdout=log, stderr=subprocess.STDOUT)
    if not os.path.exists(summary_path):
        return {"passed": 0, "failed": 0, "errors": 1, "skipped": 0, "failures": ["kiln conformance wrote no summary"]}
    with open(summary_path) as f:
        summary = json.load(f)
    # JUnit, like the pytest suites: unsupported cases are skipped ones.
    suite = ET.Element("testsuite", name="conformance_gpu")
    for c in summary["cases"]:
        case = ET.SubElement(suite, "testcase", classname="conformance", name=c["name"])
        if c["status"] == "FAIL":
            ET.SubElement(case, "failure", message=c["reason"][:2000])
        elif c["status"] == "UNSUPPORTED":
            ET.SubElement(case, "skipped", message=c["reason"][:500])
    ET.ElementTree(suite).write(os.path.join(out, "junit-conformance.xml"), encoding="unicode")
    counts = {"passed": summary["pass"], "failed": summary["fail"], "errors": 0, "skipped": summary["unsupported"],
              "failures": [c["name"] for c in summary["cases"] if c["status"] == "FAIL"]}
    if summary["pass"] < CONFORMANCE_FLOOR:
        counts["errors"] += 1
        counts["failures"].append(f"{summary['pass']} cases passed, below the floor of {CONFORMANCE_FLOOR}")
    import onnx  # noqa: PLC0415  (the machine's onnx: the cases' version)
    counts["onnx"] = onnx.__version__
    return counts


def cmd_run(args) -> int:
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    kiln, build = unpack_binary()
    identity = gpu_identity()
    env = dict(os.environ, KILN_BIN=kiln, PYTHONUNBUFFERED="1", PYTHONPATH=os.path.join(ROOT, "build-gpu", "python"))
    try:
        import nvidia.cudnn  # noqa: PLC0415
        cudnn = os.path.join(nvidia.cudnn.__path__[0], "lib")
    except ImportError:
        cudnn = ""
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (cudnn, "/usr/local/cuda/lib64", env.get("LD_LIBRARY_PATH", "")) if p)
    version = subprocess.run([kiln, "--version"], capture_output=True, text=True, env=env).stdout.strip()
    suites = args.suites.split(",") if args.suites else list(SUITES)
    run = {"schema": "kiln.gpu-gate/1", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           **identity, "kiln_version": version, "commit": build["commit"], "source_hash": build["source_hash"],
           "binary_sha256": build["binary_sha256"], "suites": {}}
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
                                "--timeout", "900", f"--junitxml={junit}", "-o", "junit_family=xunit2"],
                               cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            counts = junit_counts(junit)
        counts["seconds"] = round(time.monotonic() - t0, 1)
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
    return {"schema": "kiln.gpu-gate-index/1", "records": [], "unverified": []}


def is_full(record: dict) -> bool:
    return set(record["suites"]) >= set(SUITES) and all(
        s["failed"] == 0 and s["errors"] == 0 for s in record["suites"].values())


def write_index(index: dict) -> None:
    os.makedirs(GATE_DIR, exist_ok=True)
    index["records"].sort(key=lambda r: r["date"])
    with open(INDEX, "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    lines = ["# GPU gate runs", "",
             "Written by `python3 scripts/gpu_gate.py record` from runs of `scripts/gpu_gate.py run` on the GPU",
             "machine (tests/gpu, serially, with JUnit XML; GPU conformance against its floor of "
             f"{CONFORMANCE_FLOOR} passing cases of onnx {CONFORMANCE_ONNX}'s node tests). `scripts/gpu_gate.py check` (a CTest) fails",
             "when the sources differ from every full record below and no unverified entry names them.", "",
             "| date | commit | GPU | driver | binary sha256 | source hash | " + " | ".join(SUITES) + " | full |",
             "| --- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in SUITES) + " | --- |"]
    for r in reversed(index["records"]):
        cells = []
        for suite in SUITES:
            s = r["suites"].get(suite)
            cells.append("not run" if s is None else f"{s['passed']} passed, {s['failed'] + s['errors']} failed")
        lines.append(f"| {r['date'][:10]} | {r['commit'][:12]} | {r['gpu']} | {r['driver']} | {r['binary_sha256'][:12]} | "
                     f"{r['source_hash'][:12]} | " + " | ".join(cells) + f" | {'yes' if is_full(r) else 'no'} |")
    if index["unverified"]:
        lines += ["", "## Sources not run on a GPU", "", "| date | source hash | reason |", "| --- | --- | --- |"]
        lines += [f"| {u['date'][:10]} | {u['source_hash'][:12]} | {u['reason']} |" for u in reversed(index["unverified"])]
    with open(os.path.join(GATE_DIR, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def cmd_record(args) -> int:
    index = load_index()
    runs = []
    for d in args.dirs:
        with open(os.path.join(d, "run.json")) as f:
            runs.append((d, json.load(f)))
    binaries = {r["binary_sha256"] for _, r in runs}
    if len(binaries) != 1:
        sys.exit("gpu_gate: the runs are of different binaries; record each binary's runs separately")
    first = runs[0][1]
    record = next((r for r in index["records"] if r["binary_sha256"] == first["binary_sha256"] and r["gpu"] == first["gpu"]),
                  None)
    if record is None:
        slug = re.sub(r"[^A-Za-z0-9]+", "-", first["gpu"]).strip("-").lower()
        record = {k: first[k] for k in ("date", "gpu", "driver", "kiln_version", "commit", "source_hash", "binary_sha256")}
        record["dir"] = f"{first['date'][:10]}-{first['commit'][:10]}-{slug}"
        record["suites"] = {}
        index["records"].append(record)
    dest = os.path.join(GATE_DIR, record["dir"])
    os.makedirs(dest, exist_ok=True)
    for d, run in runs:
        for suite, counts in run["suites"].items():
            record["suites"][suite] = counts
        for name in os.listdir(d):
            if name.startswith("junit-") or name.endswith(".log"):
                shutil.copy(os.path.join(d, name), os.path.join(dest, name))
    with open(os.path.join(dest, "run.json"), "w") as f:
        json.dump(record, f, indent=1)
    write_index(index)
    counts = ", ".join(f"{k}: {v['passed']} passed, {v['failed'] + v['errors']} failed" for k, v in record["suites"].items())
    print(f"recorded {record['dir']}: {'full' if is_full(record) else 'not full'} ({counts})")
    return 0


def cmd_unverified(args) -> int:
    index = load_index()
    h = source_hash()
    index["unverified"] = [u for u in index["unverified"] if u["source_hash"] != h]
    index["unverified"].append({"date": datetime.date.today().isoformat(), "source_hash": h, "commit_base": git_commit(),
                                "reason": args.reason})
    write_index(index)
    print(f"sources {h[:12]} recorded as not run on a GPU: {args.reason}")
    return 0


def cmd_check(args) -> int:
    index = load_index()
    h = source_hash()
    full = [r for r in index["records"] if is_full(r)]
    if any(r["source_hash"] == h for r in full):
        r = next(r for r in reversed(full) if r["source_hash"] == h)
        print(f"gpu gate: the sources ({h[:12]}) passed the whole GPU suite on {r['gpu']} on {r['date'][:10]} "
              f"(binary {r['binary_sha256'][:12]}, {r['dir']})")
        return 0
    last = full[-1] if full else None
    where = (f"the last full GPU run was of sources {last['source_hash'][:12]} (commit {last['commit'][:12]}, "
             f"{last['gpu']}, {last['date'][:10]})" if last else "there is no full GPU run on record")
    mentioned = [u for u in index["unverified"] if u["source_hash"] == h]
    if mentioned:
        print(f"gpu gate: UNVERIFIED on a GPU: sources {h[:12]}; {where}. Reason given: {mentioned[-1]['reason']}")
        partial = [r for r in index["records"] if r["source_hash"] == h]
        for r in partial:
            print(f"  partial run of these sources on {r['gpu']}: " +
                  ", ".join(f"{k} {v['passed']} passed/{v['failed'] + v['errors']} failed" for k, v in r["suites"].items()))
        return 0
    print(f"gpu gate: FAILED: the sources ({h[:12]}) have no full GPU run on record: {where}.\n"
          "Run the suite on the GPU machine (scripts/build_gpu.sh, then scripts/gpu_gate.py run there, then "
          "scripts/gpu_gate.py record), or say why it cannot run: scripts/gpu_gate.py unverified --reason '...'.",
          file=sys.stderr)
    return 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("source-hash")
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--suites", default="", help=f"comma-separated, of: {', '.join(SUITES)} (default: all)")
    rec = sub.add_parser("record")
    rec.add_argument("dirs", nargs="+")
    u = sub.add_parser("unverified")
    u.add_argument("--reason", required=True)
    sub.add_parser("check")
    args = p.parse_args()
    if args.command == "source-hash":
        print(source_hash())
        return 0
    return {"run": cmd_run, "record": cmd_record, "unverified": cmd_unverified, "check": cmd_check}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
