"""The argument parser of kiln's Python commands."""
from __future__ import annotations

import argparse
import sys


class UsageParser(argparse.ArgumentParser):
    """argparse whose usage errors read as the rest of the command line's: one line
    `kiln: error: PROG: ... (PROG --help)` and exit status 1 (argparse's own is 2)."""

    def error(self, message: str):
        sys.stderr.write(f"kiln: error: {self.prog}: {message} ({self.prog} --help)\n")
        sys.exit(1)
