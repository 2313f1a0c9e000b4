#!/usr/bin/env python3
"""`kiln export` as a script: python/kiln/export.py, loaded by path so that it runs (and the
scripts and tests that import it work) without kiln's extension module being built.

    python scripts/export_model.py resnet18 -o resnet18.onnx     # same as: kiln export resnet18 ...
"""
import importlib.util
import os
import sys

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python", "kiln", "export.py")
_spec = importlib.util.spec_from_file_location("kiln_export", _PATH)
_module = importlib.util.module_from_spec(_spec)
sys.modules["kiln_export"] = _module  # dataclasses look their module up by name
_spec.loader.exec_module(_module)
globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})

if __name__ == "__main__":
    sys.exit(_module.main())
