"""The Python package as a user gets it: `pip wheel .` builds the wheel (scikit-build-core,
pyproject.toml) of the distribution kiln-engine, which installs the package `kiln` with its
extension module, its type information and the `kiln` command line, and works from a folder that
is not the source tree. The CPU engine only (-C cmake.define.KILN_WITH_CUDA=OFF), so that CI
compiles kiln once more rather than twice; without build isolation, with the pybind11 and
scikit-build-core of the test's Python (scripts/setup.sh --for-tests installs them), as nothing
else may be downloaded at test time.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_pip_wheel_gives_a_working_package_and_command_line(tmp_path):
    with open(os.path.join(REPO, "VERSION")) as f:
        version = f.read().strip()
    # The build folder is the repository's ignored build-pip-test/, so a rerun is incremental. It
    # is as deep as build/, which scripts/setup.sh --for-tests compiles through ccache with paths
    # relative to the repository: the same sources compiled here are cache hits.
    build_dir = os.path.join(REPO, "build-pip-test")
    wheels = tmp_path / "wheels"
    options = ["-C", "cmake.define.KILN_WITH_CUDA=OFF", "-C", f"build-dir={build_dir}"]
    if shutil.which("ccache"):
        options += ["-C", f"cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR={REPO};CCACHE_NOHASHDIR=true;ccache"]
        # ccache keys on the compiler's name too: the developer build's (tests/e2e/CMakeLists.txt).
        if os.environ.get("KILN_CXX_COMPILER"):
            options += ["-C", f"cmake.define.CMAKE_CXX_COMPILER={os.environ['KILN_CXX_COMPILER']}"]
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(wheels),
                        *options, REPO], capture_output=True, text=True, timeout=3000)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    [wheel] = list(wheels.glob("*.whl"))
    assert wheel.name.startswith(f"kiln_engine-{version}-"), wheel.name

    # What the wheel holds: the package with its type information, the license, the metadata.
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(f"kiln_engine-{version}.dist-info/METADATA").decode()
    for want in ("kiln/__init__.py", "kiln/py.typed", "kiln/_kiln.pyi"):
        assert want in names, (want, names)
    assert any(n.startswith("kiln/_kiln") and n.endswith(".so") for n in names), names
    assert any(n.endswith(".data/scripts/kiln") for n in names), names
    assert any(n.endswith("/LICENSE") for n in names) and any(n.endswith("/NOTICE") for n in names), names
    assert "Name: kiln-engine\n" in metadata and f"Version: {version}\n" in metadata, metadata[:500]
    assert "License-Expression: Apache-2.0" in metadata, metadata[:800]

    target = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    kiln_cli = target / "bin" / "kiln"
    assert kiln_cli.exists()

    # Import and run from elsewhere, with only the installed copy on the path.
    script = (
        "import importlib.metadata, kiln, numpy as np\n"
        "assert kiln.__file__.startswith(%r), kiln.__file__\n"
        "e = kiln.Engine.from_onnx(%r)\n"
        "out = e.run({'input': np.ones((2, 1, 28, 28), np.float32)})['logits']\n"
        "assert out.shape == (2, 10), out.shape\n"
        "print('ok', kiln.__version__, importlib.metadata.version('kiln-engine'))\n"
    ) % (str(target), os.path.join(REPO, "models", "fashion_mnist_resnet.onnx"))
    env = dict(os.environ, PYTHONPATH=str(target))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0 and f"ok {version} {version}" in r.stdout, r.stdout + r.stderr
    v = subprocess.run([str(kiln_cli), "--version"], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and v.stdout.splitlines() == [f"kiln {version}", "backends: cpu (built without the CUDA backend)"], v.stdout
