#!/usr/bin/env python3
"""Runs kiln's libFuzzer targets for a set time each and records what they did: executions,
executions per second, coverage, and findings (each input that crashed or made a sanitizer
report, with the report's summary line). A finding ends libFuzzer's run; the campaign keeps it
and starts the fuzzer again on the grown corpus until the time is spent.

    python3 scripts/fuzz_campaign.py run --build build-fuzz --seconds fuzz_graph=1200 fuzz_onnx_import=600 \
        -o bench/results/fuzz/campaign.json
    python3 scripts/fuzz_campaign.py table bench/results/fuzz/*.json       # the Markdown table of docs/design/fuzzing.md

Each fuzzer runs on one core, on a fresh work folder seeded from its corpus (the committed one:
fuzz/corpus/graph and fuzz/seeds for fuzz_graph; the fuzz build's corpus_* folders for the others),
so the committed corpus is read, never written. Findings are copied next to the JSON file.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

# fuzzer -> (corpus folders relative to the fuzz build, or to the repository with "repo:"), extra flags
FUZZERS = {
    "fuzz_graph": (["repo:fuzz/corpus/graph", "fuzz/corpus_graph"], ["-max_len=4096", "-len_control=0"]),
    "fuzz_onnx_import": (["fuzz/corpus_onnx"], ["-max_len=65536"]),
    "fuzz_engine_file": (["fuzz/corpus_engine"], []),
    "fuzz_npy": (["fuzz/corpus_npy"], []),
    "fuzz_infer_request": (["fuzz/corpus_infer"], ["-max_len=4096"]),
}

STAT = re.compile(r"^stat::(\w+):\s+(\d+)", re.M)
COVERAGE = re.compile(r"cov: (\d+) ft: (\d+) corp: (\d+)/")
ARTIFACT = re.compile(r"Test unit written to (\S+)")
SUMMARY = re.compile(r"^(SUMMARY: .*|==\d+== ?ERROR: .*|.*runtime error: .*)$", re.M)


def git_commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def cpu_model() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run_fuzzer(build: pathlib.Path, name: str, seconds: int, findings_dir: pathlib.Path) -> dict:
    corpora, flags = FUZZERS[name]
    binary = build / "fuzz" / name
    if not binary.is_file():
        sys.exit(f"fuzz_campaign: {binary} not found: ninja -C {build} {name}")
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"{name}-"))
    artifacts = pathlib.Path(tempfile.mkdtemp(prefix=f"{name}-artifacts-"))
    seeds = [str(ROOT / c[5:]) if c.startswith("repo:") else str(build / c) for c in corpora]
    seeds = [s for s in seeds if os.path.isdir(s)]
    totals = {"executions": 0, "new_inputs": 0, "peak_rss_mb": 0}
    coverage = (0, 0, 0)
    findings = []
    deadline = time.monotonic() + seconds
    starts = 0
    while (left := int(deadline - time.monotonic())) > 5:
        starts += 1
        cmd = [str(binary), f"-max_total_time={left}", "-print_final_stats=1", f"-artifact_prefix={artifacts}/",
               *flags, str(work), *seeds]
        print(f"[{name}] run {starts}: {left} s left", file=sys.stderr, flush=True)
        out = subprocess.run(cmd, capture_output=True, text=True, errors="replace").stderr
        stats = {k: int(v) for k, v in STAT.findall(out)}
        totals["executions"] += stats.get("number_of_executed_units", 0)
        totals["new_inputs"] += stats.get("new_units_added", 0)
        totals["peak_rss_mb"] = max(totals["peak_rss_mb"], stats.get("peak_rss_mb", 0))
        if cov := COVERAGE.findall(out):
            coverage = tuple(int(x) for x in cov[-1])
        if artifact := ARTIFACT.search(out):
            path = pathlib.Path(artifact.group(1))
            kept = findings_dir / f"{name}-{path.name}"
            findings_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, kept)
            report = [m.strip().replace(f"{ROOT}/", "") for m in SUMMARY.findall(out)]  # paths from the repository
            findings.append({"input": f"{findings_dir.name}/{kept.name}", "report": report[:3]})  # beside the JSON
            print(f"[{name}] finding: {report[:1]}", file=sys.stderr, flush=True)
        elif not stats:
            sys.exit(f"fuzz_campaign: {name} ended without its final stats:\n{out[-2000:]}")
        # Seeds are in the work folder now; later runs read it alone (plus the corpus, cheap to reread).
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(artifacts, ignore_errors=True)
    return {"fuzzer": name, "seconds": seconds, "runs": starts, **totals,
            "executions_per_second": round(totals["executions"] / seconds, 1),
            "coverage_edges": coverage[0], "coverage_features": coverage[1], "corpus_inputs": coverage[2],
            "findings": findings}


def cmd_run(args: argparse.Namespace) -> int:
    build = (ROOT / args.build).resolve()
    out = pathlib.Path(args.output).resolve()
    plan = {}
    for item in args.seconds:
        name, _, value = item.partition("=")
        if name not in FUZZERS or not value.isdigit():
            sys.exit(f"fuzz_campaign: --seconds takes FUZZER=SECONDS with FUZZER one of {', '.join(FUZZERS)}; got '{item}'")
        plan[name] = int(value)
    started = datetime.datetime.now(datetime.timezone.utc)
    results = [run_fuzzer(build, name, seconds, out.parent / (out.stem + "-findings")) for name, seconds in plan.items()]
    record = {"date": started.date().isoformat(), "commit": git_commit(), "cpu": cpu_model(), "cores_per_fuzzer": 1,
              "sanitizers": "AddressSanitizer + UndefinedBehaviorSanitizer (KILN_FUZZ=ON, clang)", "fuzzers": results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(table([record]))
    return 0


def table(records: list[dict]) -> str:
    lines = ["| date, commit | fuzzer | time | executions | per second | coverage (edges) | findings |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in records:
        for f in r["fuzzers"]:
            reports = dict.fromkeys(x["report"][0] if x["report"] else x["input"] for x in f["findings"])  # once each
            found = "; ".join(reports) or "none"
            lines.append(f"| {r['date']}, {r['commit'][:7]} | `{f['fuzzer']}` | {f['seconds']} s | {f['executions']:,} | "
                         f"{f['executions_per_second']:,} | {f['coverage_edges']:,} | {found} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the fuzzers and write the JSON record")
    r.add_argument("--build", default="build-fuzz", help="the fuzz build folder (KILN_FUZZ=ON)")
    r.add_argument("--seconds", nargs="+", required=True, metavar="FUZZER=SECONDS")
    r.add_argument("-o", "--output", required=True, help="the JSON file to write")
    t = sub.add_parser("table", help="print the Markdown table of JSON records")
    t.add_argument("records", nargs="+")
    args = p.parse_args()
    if args.command == "run":
        return cmd_run(args)
    print(table([json.loads(pathlib.Path(f).read_text()) for f in args.records]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
