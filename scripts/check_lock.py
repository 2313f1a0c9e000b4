#!/usr/bin/env python3
"""Exit 0 when this Python has every package of a lock file (requirements/*.lock) at its pinned
version; otherwise list what is missing or differs and exit 1 (scripts/setup.sh then installs
the lock).

    python3 scripts/check_lock.py requirements/dev.lock
"""
import re
import sys
from importlib import metadata


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> int:
    installed = {normalized(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}
    wrong = []
    with open(sys.argv[1]) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if not line:
                continue
            name, _, version = line.partition("==")
            have = installed.get(normalized(name))
            if have != version:
                wrong.append(f"{name}: {have or 'missing'}, the lock pins {version}")
    for w in wrong:
        print(w)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
