"""What the GPU serving tests share: `kiln serve` started as a user starts it (tests/e2e/test_serve.py's
Server), a gRPC client (Triton's tritonclient.grpc, in this process; the server is another one),
and kiln's per-device run counts read from /metrics."""
from __future__ import annotations

import re
import urllib.request

import numpy as np

from test_serve import Server, _free_port  # noqa: F401  (tests/e2e, on the path through conftest.py)


def grpc_infer(server: Server, model: str, name: str, x: np.ndarray, output: str) -> np.ndarray:
    import tritonclient.grpc as grpc

    client = grpc.InferenceServerClient(f"localhost:{server.grpc_port}")
    inp = grpc.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp]).as_numpy(output)


def runs_by_device(server: Server, model: str) -> dict[str, float]:
    """kiln_runs_total of `model` per device label."""
    with urllib.request.urlopen(f"http://{server.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    runs = {}
    for labels, count in re.findall(r"^kiln_runs_total{([^}]*)} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if labels.get("model") == model:
            runs[labels["device"]] = float(count)
    return runs


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))
