#!/usr/bin/env python3
"""Every figure of README.md is in the JSON file its row or paragraph links.

A figure is a number with a decimal point (0.3018 ms, 25.8 MB, 91.2%) in the README's prose and
tables; code (`...` spans, fenced and indented blocks), link targets and dates are not figures.
Each table row and each paragraph holding figures must link at least one JSON file under
bench/results/, and each figure must be a number of one of those files at the precision shown:
as it is, as a percentage of a fraction, or in MB (10^6 bytes). A figure typed by hand, or left
behind when the JSON changed, fails with the line that holds it.

    check_readme_figures.py [README.md]
"""
from __future__ import annotations

import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JSON_LINK = re.compile(r"\]\(((?:\.\./)*bench/results/[^)\s]+\.json)\)")
FIGURE = re.compile(r"(?<![\w.\-/])(\d+\.\d+)(?![\d.]*\d)(\s*%|\s*MB)?")


def blocks(text: str):
    """(first line number, text) of each paragraph and table row, code left out."""
    out, current, start, fenced = [], [], 0, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            line = ""
        if fenced or line.startswith("    ") or not line.strip() or line.startswith("|"):
            if current:
                out.append((start, " ".join(current)))
                current = []
            if line.startswith("|") and not fenced:
                out.append((number, line))
            continue
        if not current:
            start = number
        current.append(line)
    if current:
        out.append((start, " ".join(current)))
    return out


def numbers(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers(v)]
    return []


def found(figure: str, unit: str, values: list[float]) -> bool:
    shown = float(figure)
    half_step = 0.5 * 10 ** -len(figure.split(".")[1]) + 1e-12
    scales = [1.0]
    if unit.strip() == "%":
        scales.append(100.0)
    if unit.strip() == "MB":
        scales = [1e-6]
    return any(abs(v * s - shown) <= half_step for v in values for s in scales)


def main() -> int:
    readme = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "README.md")
    with open(readme) as f:
        text = f.read()
    failures, checked = [], 0
    for line, block in blocks(text):
        links = JSON_LINK.findall(block)
        prose = re.sub(r"`[^`]*`", " ", block)               # code spans
        prose = re.sub(r"\]\([^)]*\)", "]", prose)            # link targets
        prose = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", " ", prose)  # dates
        figures = FIGURE.findall(prose)
        if not figures:
            continue
        if not links:
            failures.append(f"README.md:{line}: figures {[f + u for f, u in figures]} with no JSON under bench/results/ linked")
            continue
        values = []
        for link in links:
            path = os.path.normpath(os.path.join(os.path.dirname(readme), link))
            if not os.path.exists(path):
                failures.append(f"README.md:{line}: links {link}, which does not exist")
                continue
            with open(path) as f:
                values += numbers(json.load(f))
        for figure, unit in figures:
            checked += 1
            if not found(figure, unit, values):
                failures.append(f"README.md:{line}: {figure}{unit} is in none of {links}")
    for failure in failures:
        print(failure)
    print(f"{checked} figures checked against their JSON, {len(failures)} problems")
    return 1 if failures or not checked else 0


if __name__ == "__main__":
    sys.exit(main())
