#!/usr/bin/env python3
"""The stages of kiln depend downward only (docs/architecture.md, "Stages"): a file may include
headers of its own stage and of the stages below it, never of a stage above it nor of another
stage at its own level. Fails listing every include that breaks this, file and line.

    python3 tests/layering/check_layering.py [ROOT]
"""
from __future__ import annotations

import os
import re
import sys

# Each stage (a folder of src/, python/bindings, or a public header of include/kiln/) and its
# level; a stage may include its own headers and those of any lower level.
LEVELS = {
    "types": 0,  # the public data types: include/kiln/error.h, tensor.h, types.h
    "ir": 1,
    "io": 2, "onnx": 2, "ops": 2,
    "backend": 3, "passes": 3,
    "cpu": 4,
    "cuda": 5,  # above cpu: nodes without a GPU layer run on the CPU kernels (cuda/layers/fallback.cc)
    "compiler": 6,
    "engine": 7,
    "api": 8,  # src/api implements include/kiln/kiln.h
    "calibration": 9,
    "serve": 10,  # kiln serve's native gRPC front: the public API only (docs/serving.md)
    "tools": 11, "python": 11,
}
# Stages with folders of their own, and each folder's level inside the stage: a folder may include
# its own headers and those of lower folders (docs/architecture.md, "The CUDA backend").
FOLDERS = {"cuda": {"runtime": 0, "kernels": 1, "layers": 2}}
# Public headers, by stage.
PUBLIC = {"kiln/error.h": "types", "kiln/tensor.h": "types", "kiln/types.h": "types", "kiln/kiln.h": "api"}
# Headers generated at build time, by the stage they belong to.
GENERATED = {"onnx.pb.h": "onnx", "inference.grpc.pb.h": "serve", "inference.pb.h": "serve"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def stage_of_file(rel: str) -> str | None:
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[0] == "include" and len(parts) == 3:
        return PUBLIC.get(f"kiln/{parts[2]}")
    if parts[:2] == ["python", "bindings"]:
        return "python"
    return None


def stage_of_include(path: str) -> str | None:
    if path in GENERATED:
        return GENERATED[path]
    if path.startswith("kiln/"):
        return PUBLIC.get(path)
    first = path.split("/")[0]
    return first if "/" in path and first in LEVELS else None


def violations(root: str) -> list[str]:
    found = []
    for top in ("src", "include", "python/bindings"):
        for dirpath, _, filenames in os.walk(os.path.join(root, top)):
            for name in sorted(filenames):
                if not name.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                stage = stage_of_file(rel)
                if stage is None or stage not in LEVELS:
                    found.append(f"{rel}: no stage of kiln holds it (add its folder to LEVELS, or a public header to "
                                 f"PUBLIC, in tests/layering/check_layering.py)")
                    continue
                with open(os.path.join(root, rel), encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        path = m.group(1)
                        target = stage_of_include(path)
                        if target == stage and stage in FOLDERS:
                            found.extend(folder_violations(rel, number, stage, path))
                            continue
                        if target == stage or (target is None and not path.startswith("kiln/") and "/" not in path):
                            continue  # its own stage, or a header beside the file
                        if target is None:
                            found.append(f"{rel}:{number}: includes {path}, of no known stage")
                        elif LEVELS[target] > LEVELS[stage]:
                            found.append(f"{rel}:{number}: {stage} (level {LEVELS[stage]}) includes {m.group(1)} "
                                         f"of {target} (level {LEVELS[target]}), a stage above it")
                        elif LEVELS[target] == LEVELS[stage]:
                            found.append(f"{rel}:{number}: {stage} includes {m.group(1)} of {target}, "
                                         f"another stage at its level ({LEVELS[stage]})")
    return found


def folder_violations(rel: str, number: int, stage: str, path: str) -> list[str]:
    """An include inside a stage with folders: every file sits in a known folder, and includes only
    its own folder's headers and lower folders'."""
    levels = FOLDERS[stage]
    parts = rel.split("/")  # src/<stage>/<folder>/<file>
    mine = parts[2] if len(parts) > 3 else None
    theirs = path.split("/")[1] if path.count("/") >= 2 else None
    if mine not in levels:
        return [f"{rel}:{number}: src/{stage}/ files belong in one of its folders {sorted(levels)}"]
    if theirs not in levels:
        return [f"{rel}:{number}: includes {path}, in none of src/{stage}/'s folders {sorted(levels)}"]
    if levels[theirs] > levels[mine]:
        return [f"{rel}:{number}: {stage}/{mine} includes {path} of {stage}/{theirs}, a folder above it"]
    return []


def self_test() -> None:
    """The check itself must catch what it exists for: an upward include, a sibling's, an unknown
    stage; and pass downward ones."""
    import tempfile

    files = {"src/ir/a.h": '#include "cpu/engine.h"\n',          # upward
             "src/onnx/b.cc": '#include "ops/conv.h"\n',         # a sibling stage
             "src/cuda/layers/c.cc": '#include "cpu/engine.h"\n#include "ir/graph.h"\n#include "kiln/types.h"\n'
                                     '#include "cuda/kernels/k.h"\n#include "cuda/runtime/r.h"\n',  # downward
             "src/cuda/kernels/k.h": '#include "cuda/layers/l.h"\n',  # a folder above it
             "src/cuda/e.cc": '#include "cuda/runtime/r.h"\n',  # in no folder
             "src/tools/d.cc": '#include "nowhere/x.h"\n#include "kiln/kiln.h"\n#include "near.h"\n',  # unknown, downward
             "include/kiln/types.h": '#include "kiln/kiln.h"\n'}  # the data types on the API: upward
    with tempfile.TemporaryDirectory() as root:
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        found = violations(root)
    expected = ["include/kiln/types.h:1", "src/cuda/e.cc:1", "src/cuda/kernels/k.h:1", "src/ir/a.h:1", "src/onnx/b.cc:1",
                "src/tools/d.cc:1"]
    got = sorted(v.split(": ")[0] for v in found)
    if got != expected:
        sys.exit(f"check_layering.py's self-test found {got}, expected {expected}:\n" + "\n".join(found))


def main() -> int:
    self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = violations(root)
    for v in found:
        print(v)
    if found:
        print(f"{len(found)} include(s) cross kiln's stages the wrong way (docs/architecture.md, \"Stages\")")
        return 1
    print("every include goes down the stages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
