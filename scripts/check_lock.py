#!/usr/bin/env python3
"""Exit 0 when this Python has every package of a lock file (requirements/*.lock) at its pinned
version, those of the locks it includes (`-r demo.lock`, as pip reads it) too; otherwise list
what is missing or differs and exit 1 (scripts/setup.sh then installs the lock).

    python3 scripts/check_lock.py requirements/dev.lock
"""
import os
import re
import sys
from importlib import metadata


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock: str) -> list[tuple[str, str]]:
    """(name, version) of every pin of `lock` and of the files it includes with -r."""
    out = []
    with open(lock) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line.startswith("-r "):
                out += pins(os.path.join(os.path.dirname(lock), line[3:].strip()))
            elif line:
                name, sep, version = line.partition("==")
                if not sep:
                    raise SystemExit(f"{lock}: '{line}' is not a pin (NAME==VERSION) nor -r FILE")
                out.append((name, version))
    return out


def main() -> int:
    installed = {normalized(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}
    wrong = []
    for name, version in pins(sys.argv[1]):
        have = installed.get(normalized(name))
        if have != version:
            wrong.append(f"{name}: {have or 'missing'}, the lock pins {version}")
    for w in wrong:
        print(w)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
