#!/usr/bin/env python3
"""kiln's version is single-sourced: the one line of VERSION is what CMake builds in (`kiln
--version`, kiln.__version__ of the build's Python package), what pyproject.toml gives the wheel
(scikit-build-core's regex provider reading VERSION), and has a heading in CHANGELOG.md.

    check_version.py REPO KILN_BINARY BACKENDS [BUILD_PYTHON_DIR]

BACKENDS is the second line `kiln --version` must print ("backends: cpu, cuda (compiled for
sm_90)"), as CMake configured the build.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib


def main() -> int:
    repo, kiln_bin, backends = sys.argv[1], sys.argv[2], sys.argv[3]
    python_dir = sys.argv[4] if len(sys.argv) > 4 else None
    failures = []

    with open(os.path.join(repo, "VERSION")) as f:
        text = f.read()
    if not re.fullmatch(r"\d+\.\d+\.\d+\n?", text):
        print(f"VERSION holds {text!r}: expected one line MAJOR.MINOR.PATCH")
        return 1
    version = text.strip()

    with open(os.path.join(repo, "pyproject.toml"), "rb") as f:
        pyproject = tomllib.load(f)
    project = pyproject["project"]
    meta = pyproject.get("tool", {}).get("scikit-build", {}).get("metadata", {}).get("version", {})
    if "version" in project or "version" not in project.get("dynamic", []):
        failures.append("pyproject.toml: [project] must list version as dynamic, not give it")
    elif meta.get("provider") != "scikit_build_core.metadata.regex" or meta.get("input") != "VERSION":
        failures.append(f"pyproject.toml: the version must come from VERSION through the regex provider, not {meta}")
    else:
        m = re.search(meta["regex"], text, re.MULTILINE)
        if not m or m.group("value") != version:
            failures.append(f"pyproject.toml's regex {meta['regex']!r} reads {m and m.group('value')!r} from VERSION, not {version}")

    p = subprocess.run([kiln_bin, "--version"], capture_output=True, text=True, timeout=60)
    first = p.stdout.splitlines()[0] if p.stdout else ""
    if p.returncode != 0 or first != f"kiln {version}":
        failures.append(f"`kiln --version` printed {p.stdout!r} (exit {p.returncode}), not 'kiln {version}' first")
    elif p.stdout.splitlines()[1:] != [backends]:
        failures.append(f"`kiln --version` printed {p.stdout!r}; its second line should be {backends!r}")

    if python_dir:
        code = "import sys; sys.path.insert(0, sys.argv[1]); import kiln; print(kiln.__version__)"
        p = subprocess.run([sys.executable, "-c", code, python_dir], capture_output=True, text=True, timeout=120)
        if p.returncode != 0 or p.stdout.strip() != version:
            failures.append(f"kiln.__version__ from {python_dir} is {p.stdout.strip()!r} ({p.stderr.strip()[-300:]}), not {version}")

    with open(os.path.join(repo, "CHANGELOG.md")) as f:
        if not re.search(rf"^## {re.escape(version)}\b", f.read(), re.MULTILINE):
            failures.append(f"CHANGELOG.md has no heading '## {version}'")

    for failure in failures:
        print("version:", failure)
    if not failures:
        print(f"version {version}: VERSION, pyproject.toml, kiln --version, kiln.__version__ and CHANGELOG.md agree")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
