"""`pip install .` as a user runs it: the wheel builds (scikit-build-core, pyproject.toml), installs
the package with its extension module and the `kiln` command line, and works from a folder
that is not the source tree. The CPU engine only (-C cmake.define.KILN_WITH_CUDA=OFF), so that CI
compiles kiln once more rather than twice; without build isolation, with the pybind11 and
scikit-build-core of the test's Python (scripts/setup.sh installs them), as nothing else may be
downloaded at test time.
"""
from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_pip_install_gives_a_working_package_and_command_line(tmp_path):
    target = tmp_path / "site"
    # The build folder is kept under the repository's ignored build-pip/, so a rerun is incremental.
    build_dir = os.path.join(REPO, "build-pip", "test")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--target",
                        str(target), "-C", "cmake.define.KILN_WITH_CUDA=OFF", "-C", f"build-dir={build_dir}", REPO],
                       capture_output=True, text=True, timeout=3000)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    installed = list((target / "kiln").glob("_kiln*.so"))
    assert installed, sorted(os.listdir(target / "kiln"))
    kiln_cli = target / "bin" / "kiln"
    assert kiln_cli.exists()

    # Import and run from elsewhere, with only the installed copy on the path.
    script = (
        "import kiln, numpy as np\n"
        "assert kiln.__file__.startswith(%r), kiln.__file__\n"
        "e = kiln.Engine.from_onnx(%r)\n"
        "out = e.run({'input': np.ones((2, 1, 28, 28), np.float32)})['logits']\n"
        "assert out.shape == (2, 10), out.shape\n"
        "print('ok', kiln.__version__)\n"
    ) % (str(target), os.path.join(REPO, "models", "fashion_mnist_resnet.onnx"))
    env = dict(os.environ, PYTHONPATH=str(target))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0 and "ok 0.1.0" in r.stdout, r.stdout + r.stderr
    v = subprocess.run([str(kiln_cli), "--version"], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and v.stdout.strip() == "kiln 0.1.0"
