"""The KServe InferenceService manifests of deploy/kserve/: each follows KServe's schema (every
field one that KServe's or Kubernetes' API models know, with the type they give it), runs
`kiln serve` on the folder KServe's storage initializer fills, with flags kiln serve has, and
probes the port it serves on; the CPU one, run as its container would run it on a repository in
that folder, answers a Triton client with the engine's outputs. Nothing here runs Kubernetes."""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

from test_serve import CLASSIFIER, Server, _http_infer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFESTS = sorted(glob.glob(os.path.join(REPO, "deploy", "kserve", "*.yaml")))
# Where KServe's storage initializer puts STORAGE_URI's contents for the serving container.
MOUNT = "/mnt/models"


def schema_errors(manifest: dict, type_name: str, tmp_path) -> list[str]:
    """Where `manifest` leaves KServe's or Kubernetes' API model `type_name` (kserve_schema.py)."""
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(manifest))
    r = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kserve_schema.py"),
                        str(path), type_name], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def load(path: str) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def container_of(manifest: dict) -> dict:
    containers = manifest["spec"]["predictor"]["containers"]
    assert len(containers) == 1, "one serving container"
    return containers[0]


def flag_value(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} not in {args}"
    return args[args.index(flag) + 1]


def test_there_are_manifests_for_the_cpu_and_the_gpu():
    devices = {flag_value(container_of(load(m))["args"], "--device") for m in MANIFESTS}
    assert devices == {"cpu", "cuda"}, MANIFESTS


@pytest.mark.parametrize("path", MANIFESTS, ids=os.path.basename)
def test_a_manifest_is_an_inferenceservice_running_kiln_serve(kiln_bin, path, tmp_path):
    manifest = load(path)
    assert manifest["apiVersion"] == "serving.kserve.io/v1beta1" and manifest["kind"] == "InferenceService"
    assert schema_errors(manifest, "V1beta1InferenceService", tmp_path) == []
    container = container_of(manifest)
    # KServe routes to the container named kserve-container, on its first port.
    assert container["name"] == "kserve-container"
    assert container["command"] == ["kiln"] and container["args"][:2] == ["serve", MOUNT]
    assert any(e["name"] == "STORAGE_URI" for e in container["env"]), "KServe fills /mnt/models from STORAGE_URI"
    args = container["args"]
    port = int(flag_value(args, "--http-port"))
    assert container["ports"][0]["containerPort"] == port
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": port}
    assert manifest["metadata"]["annotations"]["prometheus.kserve.io/port"] == str(port)
    # Every flag is one kiln serve takes.
    usage = subprocess.run([kiln_bin, "serve", "--help"], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, KILN_PYTHON=sys.executable))
    assert usage.returncode == 0, usage.stderr
    for flag in (a for a in args if a.startswith("--")):
        assert re.search(rf"{re.escape(flag)}(?![\w-])", usage.stdout), flag


def test_schema_check_finds_unknown_fields_and_wrong_kinds(tmp_path):
    manifest = load(MANIFESTS[0])
    container_of(manifest)["portz"] = [{"containerPort": 8080}]
    manifest["spec"]["predictor"]["minReplicas"] = "1"
    errors = schema_errors(manifest, "V1beta1InferenceService", tmp_path)
    assert ".spec.predictor.containers[0].portz: not a field of V1Container" in errors
    assert ".spec.predictor.minReplicas: a int, not '1'" in errors


def test_the_cpu_manifest_serves_a_repository_where_kserve_mounts_it(kiln_bin, tmp_path):
    (manifest,) = [load(m) for m in MANIFESTS if flag_value(container_of(load(m))["args"], "--device") == "cpu"]
    args = list(container_of(manifest)["args"][1:])  # after "serve"
    # The container's arguments as they are, but the mount's place and the ports (free ones here).
    version = tmp_path / "mnt" / "models" / "classifier" / "1"
    version.mkdir(parents=True)
    shutil.copy(CLASSIFIER, version / "model.onnx")
    args[0] = str(tmp_path / "mnt" / "models")
    for flag in ("--http-port", "--grpc-port"):
        i = args.index(flag)
        del args[i:i + 2]
    s = Server(kiln_bin, args, str(tmp_path / "server.log"))
    try:
        import kiln

        x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
        want = kiln.Engine.from_onnx(CLASSIFIER).run({"x": x})["y"]
        np.testing.assert_allclose(_http_infer(s.url, "classifier", x, binary=True), want, rtol=1e-6)
    finally:
        assert s.stop() == 0, s.output()
