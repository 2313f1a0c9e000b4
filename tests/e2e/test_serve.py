"""`kiln serve` through real clients: Triton's tritonclient over HTTP (JSON and binary tensors) and
gRPC, against the same model run in this process; many clients at once (dynamic batching gives
each its own rows); bad requests answered as protocol errors while the server keeps serving; a
Triton-style repository; bad repositories and models refused with one line; SIGTERM ends it.

Runs in the serving environment (.venv-serve: KServe, tritonclient) with the build's kiln package
on PYTHONPATH; the server is `kiln serve` started as a user starts it.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import kiln

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(REPO, "tests", "cli", "data")
CLASSIFIER = os.path.join(DATA, "dynamic_classifier.onnx")  # x: float32[N, 4] -> y: float32[N, 3]
IDENTITY = os.path.join(DATA, "image_identity.onnx")  # image: float32[1, 3, 8, 8] -> pixels, the same
MAX_BATCH = 16


def _free_port() -> int:
    """A free port below the kernel's ephemeral range. A port the kernel hands out (port 0) comes
    from that range, where other processes' sockets take theirs too: Ray's workers, started by the
    server before it binds, took one such port first."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`kiln serve ARGS` on free ports, ready (every model loaded and warmed up) or failed."""

    def __init__(self, kiln_bin: str, args: list[str], log_path: str):
        self.http_port, self.grpc_port = _free_port(), _free_port()
        env = dict(os.environ, KILN_PYTHON=sys.executable)
        # The server appends to its own descriptor; output() reads through another one. (Reading
        # through the server's would move the offset they share, and the server's next line would
        # overwrite the log's start.)
        self.log_path = log_path
        self.log = open(log_path, "a")
        self.proc = subprocess.Popen([kiln_bin, "serve", *args, "--http-port", str(self.http_port),
                                      "--grpc-port", str(self.grpc_port)], stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env)
        self.url = f"localhost:{self.http_port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"kiln serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.stop()
        raise AssertionError(f"kiln serve not ready in 180 s:\n{self.output()}")

    def output(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def runs_and_rows(self, model: str) -> tuple[float, float]:
        """Engine runs so far and the rows they ran, from /metrics."""
        return self.metric("kiln_batch_size_count", model), self.metric("kiln_batch_size_sum", model)

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://{self.url}/metrics", timeout=10) as r:
            return r.read().decode()

    def metric(self, name: str, model: str, **labels: str) -> float:
        """The value of `name` for `model` and the other labels given (device="cpu") at /metrics."""
        want = {"model": model, **labels}
        for label_text, value in re.findall(rf"^{name}{{([^}}]*)}} (\S+)$", self.metrics_text(), re.M):
            if dict(re.findall(r'(\w+)="([^"]*)"', label_text)) == want:
                return float(value)
        raise AssertionError(f"{name} {want} not in /metrics")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# Who answers gRPC: KServe's Python server, or kiln's own in C++ (src/serve/grpc_front.h), whose
# batcher then runs the HTTP requests too. Every test of a `server` runs against both.
FRONTS = ["kserve", "native"]


@pytest.fixture(scope="module", params=FRONTS)
def server(kiln_bin, tmp_path_factory, request):
    s = Server(kiln_bin, [CLASSIFIER, "--max-batch", str(MAX_BATCH), "--max-queue-delay-us", "200000",
                          "--grpc-front", request.param], str(tmp_path_factory.mktemp("serve") / "server.log"))
    s.front = request.param
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference():
    engine = kiln.Engine.from_onnx(CLASSIFIER)
    return lambda x: engine.run({"x": x})["y"]


def _http_infer(url: str, model: str, x: np.ndarray, binary: bool):
    import tritonclient.http as http

    client = http.InferenceServerClient(url)
    inp = http.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = http.InferRequestedOutput("y", binary_data=binary)
    return client.infer(model, [inp], outputs=[out]).as_numpy("y")


def _grpc_infer(port: int, model: str, x: np.ndarray):
    import tritonclient.grpc as grpc

    client = grpc.InferenceServerClient(f"localhost:{port}")
    inp = grpc.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp]).as_numpy("y")


def test_http_and_grpc_answers_are_the_engines(server, reference):
    import tritonclient.http as http

    client = http.InferenceServerClient(server.url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("dynamic_classifier")
    meta = client.get_model_metadata("dynamic_classifier")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}]
    rng = np.random.default_rng(7)
    for rows in (1, 3, MAX_BATCH):
        x = rng.standard_normal((rows, 4)).astype(np.float32)
        want = reference(x)
        np.testing.assert_allclose(_http_infer(server.url, "dynamic_classifier", x, binary=False), want, rtol=1e-6)
        np.testing.assert_allclose(_http_infer(server.url, "dynamic_classifier", x, binary=True), want, rtol=1e-6)
        np.testing.assert_allclose(_grpc_infer(server.grpc_port, "dynamic_classifier", x), want, rtol=1e-6)


def test_clients_at_once_are_batched_and_each_gets_its_rows(server, reference):
    runs_before, rows_before = server.runs_and_rows("dynamic_classifier")
    rng = np.random.default_rng(11)
    requests = [rng.standard_normal((int(rng.integers(1, 4)), 4)).astype(np.float32) for _ in range(64)]

    import tritonclient.grpc as grpc
    import tritonclient.http as http

    start = threading.Barrier(len(requests))

    def send(i: int):
        x = requests[i]
        kind = grpc if i % 2 else http
        client = kind.InferenceServerClient(f"localhost:{server.grpc_port}" if i % 2 else server.url)
        inp = kind.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        start.wait()  # every client ready: the requests leave together
        return client.infer("dynamic_classifier", [inp]).as_numpy("y")

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(send, range(len(requests))))
    for x, y in zip(requests, answers):
        np.testing.assert_allclose(y, reference(x), rtol=1e-6)
    runs, rows = server.runs_and_rows("dynamic_classifier")
    runs, rows = runs - runs_before, rows - rows_before
    assert rows == sum(len(x) for x in requests)
    # Requests sent at once, each waiting up to 200 ms for others: far fewer engine runs than requests.
    assert runs < len(requests) / 2, f"{len(requests)} requests ran as {runs} engine runs"


def test_metrics_count_every_request_error_and_run_alike_for_both_fronts(server):
    """kiln's metrics have the same names, labels and buckets whichever front answers gRPC: each
    request of either protocol counts once, refused ones as errors too, and every engine run is in
    the runs by device and in each histogram."""
    import tritonclient.grpc as grpc
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    model = "dynamic_classifier"
    names = [("kiln_requests_total", {}), ("kiln_errors_total", {}), ("kiln_runs_total", {"device": "cpu"}),
             ("kiln_batch_size_count", {}), ("kiln_batch_size_sum", {}), ("kiln_batch_size_bucket", {"le": "+Inf"}),
             ("kiln_queue_seconds_count", {}), ("kiln_compute_seconds_count", {})]

    def snapshot() -> dict:
        return {n + "".join(f"{{{k}={v}}}" for k, v in labels.items()): server.metric(n, model, **labels)
                for n, labels in names}

    before = snapshot()
    rng = np.random.default_rng(5)
    good = [rng.standard_normal((rows, 4)).astype(np.float32) for rows in (1, 2, 3)]
    for x in good:
        _http_infer(server.url, model, x, binary=True)
        _grpc_infer(server.grpc_port, model, x)
    bad = np.zeros((2, 5), np.float32)  # the model takes [-1, 4]
    for kind, client in ((http, http.InferenceServerClient(server.url)),
                         (grpc, grpc.InferenceServerClient(f"localhost:{server.grpc_port}"))):
        for _ in range(2):
            inp = kind.InferInput("x", list(bad.shape), "FP32")
            inp.set_data_from_numpy(bad)
            with pytest.raises(InferenceServerException):
                client.infer(model, [inp])
    after = snapshot()
    delta = {k: after[k] - before[k] for k in after}
    assert delta["kiln_requests_total"] == 2 * len(good) + 4, delta
    assert delta["kiln_errors_total"] == 4, delta
    runs = delta["kiln_batch_size_count"]
    assert 1 <= runs <= 2 * len(good), delta
    assert delta["kiln_runs_total{device=cpu}"] == runs and delta["kiln_batch_size_bucket{le=+Inf}"] == runs, delta
    assert delta["kiln_compute_seconds_count"] == runs, delta
    assert delta["kiln_batch_size_sum"] == 2 * sum(len(x) for x in good), delta
    assert delta["kiln_queue_seconds_count"] == 2 * len(good), delta  # one wait per request run
    # The batch-size buckets are at the same bounds for both fronts.
    bounds = [dict(re.findall(r'(\w+)="([^"]*)"', labels)) for labels in
              re.findall(r"^kiln_batch_size_bucket{([^}]*)}", server.metrics_text(), re.M)]
    assert [b["le"] for b in bounds if b["model"] == model] == \
        ["1.0", "2.0", "4.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0", "+Inf"]


def _post(url: str, body: bytes | str, path: str = "/v2/models/dynamic_classifier/infer"):
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(f"http://{url}{path}", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


BAD_REQUESTS = [
    ({"inputs": [{"name": "z", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}, "takes inputs ['x']"),
    ({"inputs": [{"name": "x", "datatype": "INT64", "shape": [1, 4], "data": [1, 2, 3, 4]}]}, "must be FP32"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 5], "data": [1, 2, 3, 4, 5]}]}, "must have shape"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}, "must have shape"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3]}]}, "input 'x'"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": ["a", "b", "c", "d"]}]}, "input 'x'"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [10**11, 4], "data": [1]}]}, "input 'x'"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [MAX_BATCH + 1, 4], "data": [0.5] * 4 * (MAX_BATCH + 1)}]},
     f"takes at most {MAX_BATCH}"),
]


@pytest.mark.parametrize("body,why", BAD_REQUESTS, ids=[w for _, w in BAD_REQUESTS])
def test_bad_requests_are_protocol_errors_and_the_server_keeps_serving(server, reference, body, why):
    status, answer = _post(server.url, json.dumps(body))
    assert status == 400, (status, answer)
    assert why in answer, answer
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(_http_infer(server.url, "dynamic_classifier", x, binary=False), reference(x), rtol=1e-6)


def test_malformed_bodies_and_unknown_models(server):
    assert _post(server.url, '{"inputs":')[0] == 422  # not JSON
    assert _post(server.url, "[]")[0] == 422  # not an infer request
    status, answer = _post(server.url, '{"inputs": []}', "/v2/models/no_such_model/infer")
    assert status == 404 and "no_such_model" in answer


def test_grpc_bad_request_is_invalid_argument(server):
    import tritonclient.grpc as grpc
    from tritonclient.utils import InferenceServerException

    client = grpc.InferenceServerClient(f"localhost:{server.grpc_port}")
    inp = grpc.InferInput("x", [1, 5], "FP32")
    inp.set_data_from_numpy(np.ones((1, 5), np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("dynamic_classifier", [inp])
    assert "INVALID_ARGUMENT" in str(e.value.status()) and "must have shape" in e.value.message()


def _repository(root, extra_config: dict | None = None):
    os.makedirs(root / "classifier" / "1")
    os.makedirs(root / "classifier" / "3")
    shutil.copy(CLASSIFIER, root / "classifier" / "1" / "model.onnx")
    shutil.copy(CLASSIFIER, root / "classifier" / "3" / "model.onnx")
    (root / "classifier" / "config.json").write_text(json.dumps({"max_batch": 4, **(extra_config or {})}))
    os.makedirs(root / "identity" / "1")
    shutil.copy(IDENTITY, root / "identity" / "1" / "model.onnx")
    return root


def test_a_repository_serves_each_models_newest_version(kiln_bin, tmp_path, reference):
    repo = _repository(tmp_path / "models", {"max_queue": 64})  # (a queue bound the model takes)
    s = Server(kiln_bin, [str(repo)], str(tmp_path / "server.log"))
    try:
        assert "models/classifier/3/model.onnx" in s.output()
        x = np.arange(16, dtype=np.float32).reshape(4, 4)
        np.testing.assert_allclose(_http_infer(s.url, "classifier", x, binary=True), reference(x), rtol=1e-6)
        status, answer = _post(s.url, json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [5, 4],
                                                              "data": [0.0] * 20}]}), "/v2/models/classifier/infer")
        assert status == 400 and "takes at most 4" in answer  # config.json's max_batch
        import tritonclient.http as http

        image = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
        inp = http.InferInput("image", [1, 3, 8, 8], "FP32")
        inp.set_data_from_numpy(image)
        got = http.InferenceServerClient(s.url).infer("identity", [inp]).as_numpy("pixels")
        np.testing.assert_array_equal(got, image)
    finally:
        assert s.stop() == 0, s.output()


def _refused(kiln_bin: str, args: list[str]) -> str:
    r = subprocess.run([kiln_bin, "serve", *args, "--http-port", str(_free_port()), "--grpc-port", str(_free_port())],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, KILN_PYTHON=sys.executable))
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    return r.stderr


def test_bad_models_and_repositories_are_refused_with_one_line(kiln_bin, tmp_path):
    assert "does not exist" in _refused(kiln_bin, [str(tmp_path / "missing.onnx")])
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07not a model")
    assert "model 'garbage'" in _refused(kiln_bin, [str(garbage)])
    assert "--max-batch" in _refused(kiln_bin, [CLASSIFIER, "--max-batch", "0"])
    assert "--max-queue" in _refused(kiln_bin, [CLASSIFIER, "--max-queue", "-1"])
    assert "--pinned-memory-mb" in _refused(kiln_bin, [CLASSIFIER, "--pinned-memory-mb", "-1"])

    repo = _repository(tmp_path / "unknown_field", {"dynamic_batching": True})
    assert "unknown field 'dynamic_batching'" in _refused(kiln_bin, [str(repo)])
    repo = _repository(tmp_path / "bad_value", {"max_batch": "8"})
    assert "'max_batch' must be an integer" in _refused(kiln_bin, [str(repo)])
    repo = _repository(tmp_path / "bad_queue", {"max_queue": -2})
    assert "'max_queue' must be an integer of at least 0" in _refused(kiln_bin, [str(repo)])
    repo = _repository(tmp_path / "bad_json")
    (repo / "classifier" / "config.json").write_text("{max_batch: 4")
    assert "not a readable JSON file" in _refused(kiln_bin, [str(repo)])
    repo = _repository(tmp_path / "no_version")
    os.makedirs(repo / "empty")
    assert "model 'empty'" in _refused(kiln_bin, [str(repo)])
    repo = _repository(tmp_path / "link_out")
    os.makedirs(repo / "outside" / "1")
    os.symlink(CLASSIFIER, repo / "outside" / "1" / "model.onnx")
    assert "leads out of the repository" in _refused(kiln_bin, [str(repo)])
    empty = tmp_path / "no_models"
    empty.mkdir()
    assert "holds no model" in _refused(kiln_bin, [str(empty)])
    assert "distinct GPU numbers" in _refused(kiln_bin, [CLASSIFIER, "--device", "cuda", "--gpus", "0,0"])
    assert "distinct GPU numbers" in _refused(kiln_bin, [CLASSIFIER, "--device", "cuda", "--gpus", "0,x"])
    assert "--gpus is for --device cuda" in _refused(kiln_bin, [CLASSIFIER, "--gpus", "1"])
    assert "--replicas 0: give N or MIN:MAX" in _refused(kiln_bin, [CLASSIFIER, "--ray", "--replicas", "0"])
    assert "--replicas 3:2: give N or MIN:MAX" in _refused(kiln_bin, [CLASSIFIER, "--ray", "--replicas", "3:2"])
    assert "--replicas and --ray-address go with --ray" in _refused(kiln_bin, [CLASSIFIER, "--replicas", "2"])
    assert "--gpus is not for --ray" in _refused(kiln_bin, [CLASSIFIER, "--ray", "--device", "cuda", "--gpus", "0"])
    repo = _repository(tmp_path / "bad_gpus", {"gpus": [0, -1]})
    assert "'gpus' must be a list of distinct GPU numbers" in _refused(kiln_bin, [str(repo)])
    assert "--batch-sizes is for --device cuda" in _refused(kiln_bin, [CLASSIFIER, "--batch-sizes", "1,4"])
    assert "--batch-sizes 1,16: give distinct integers from 1 to --max-batch (8)" in _refused(
        kiln_bin, [CLASSIFIER, "--device", "cuda", "--max-batch", "8", "--batch-sizes", "1,16"])
    repo = _repository(tmp_path / "bad_batch_sizes", {"batch_sizes": [0, 2]})
    assert "'batch_sizes' must be a list of distinct integers from 1 to max_batch (4)" in _refused(kiln_bin, [str(repo)])


def test_ray_serve_replicas_answer_as_the_engine_does(kiln_bin, tmp_path, reference):
    """kiln serve --ray: the model as a Ray Serve deployment of two replicas on a Ray instance of its
    own, the protocol served in front: HTTP and gRPC answers, many clients at once, metadata, a bad
    request answered 400 by a replica, SIGTERM."""
    s = Server(kiln_bin, [CLASSIFIER, "--ray", "--replicas", "2", "--max-batch", str(MAX_BATCH)],
               str(tmp_path / "server.log"))
    try:
        assert "model dynamic_classifier on Ray Serve: 2 replicas running (2 to 2)" in s.output()
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_allclose(_http_infer(s.url, "dynamic_classifier", x, binary=False), reference(x), rtol=1e-6)
        np.testing.assert_allclose(_grpc_infer(s.grpc_port, "dynamic_classifier", x), reference(x), rtol=1e-6)
        inputs = [np.full((1 + i % 3, 4), i, np.float32) for i in range(32)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda a: _grpc_infer(s.grpc_port, "dynamic_classifier", a), inputs))
        for a, got in zip(inputs, answers):
            np.testing.assert_allclose(got, reference(a), rtol=1e-6)
        with urllib.request.urlopen(f"http://{s.url}/v2/models/dynamic_classifier", timeout=30) as r:
            assert json.load(r)["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
        status, answer = _post(s.url, json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 5],
                                                              "data": [0.0] * 5}]}), "/v2/models/dynamic_classifier/infer")
        assert status == 400 and "must have shape" in answer
        _shared_memory_through_the_front(s, x, reference(x))
    finally:
        assert s.stop() == 0, s.output()


def _shared_memory_through_the_front(s, x: np.ndarray, want: np.ndarray) -> None:
    """Over HTTP and gRPC, x in a region of the client's shared memory (at an offset) and y asked
    for in another: the regions are registered with the front, which reads x and writes y there
    (a Ray replica knows no region); a request naming a region never registered is refused."""
    import uuid

    import tritonclient.grpc as grpc
    import tritonclient.http as http
    import tritonclient.utils.shared_memory as shm

    keys = [f"/kiln_ray_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    region_in = shm.create_shared_memory_region(keys[0].strip("/"), keys[0], 4096 + x.nbytes)
    region_out = shm.create_shared_memory_region(keys[1].strip("/"), keys[1], 4096)
    try:
        shm.set_shared_memory_region(region_in, [x], offset=4096)
        for lib, client in ((http, http.InferenceServerClient(s.url)),
                            (grpc, grpc.InferenceServerClient(f"localhost:{s.grpc_port}"))):
            shm.set_shared_memory_region(region_out, [np.zeros(want.shape, np.float32)])
            client.register_system_shared_memory("in", keys[0], 4096 + x.nbytes)
            client.register_system_shared_memory("out", keys[1], 4096)
            inp = lib.InferInput("x", list(x.shape), "FP32")
            inp.set_shared_memory("in", x.nbytes, offset=4096)
            out = lib.InferRequestedOutput("y")
            out.set_shared_memory("out", 4096)
            client.infer("dynamic_classifier", [inp], outputs=[out])
            np.testing.assert_allclose(shm.get_contents_as_numpy(region_out, np.float32, list(want.shape)), want, rtol=1e-6)
            inp.set_shared_memory("nowhere", x.nbytes)
            with pytest.raises(Exception, match="nowhere"):
                client.infer("dynamic_classifier", [inp])
            client.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(region_in)
        shm.destroy_shared_memory_region(region_out)


def test_planned_batch_sizes_and_padding():
    from kiln.serve import padded_rows, planned_batch_sizes

    assert planned_batch_sizes(1) == [1]
    assert planned_batch_sizes(16) == [1, 2, 4, 8, 16]
    sizes = planned_batch_sizes(12)
    assert sizes == [1, 2, 4, 8, 12]
    assert [padded_rows(r, sizes) for r in (1, 2, 3, 5, 9, 12)] == [1, 2, 4, 8, 12, 12]
    assert padded_rows(7, []) == 7  # the CPU engine runs any row count as it comes
    # The top octave in quarters (multiples of 8): a loaded server's 76-row batch runs as 80 rows.
    assert planned_batch_sizes(128) == [1, 2, 4, 8, 16, 32, 64, 80, 96, 112, 128]
    assert padded_rows(76, planned_batch_sizes(128)) == 80
    assert planned_batch_sizes(300) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 272, 288, 300]
    # A GPU context keeps sixteen shapes' graphs: past that the smallest sizes go.
    large = planned_batch_sizes(1 << 20)
    assert len(large) == 16 and large[0] == 1 << 8 and large[-1] == 1 << 20


def test_batch_sizes_given_are_checked_and_hold_max_batch():
    from kiln.serve import batch_size_list

    assert batch_size_list("1,8,32", 128) == [1, 8, 32, 128]
    assert batch_size_list([64, 16, 128], 128) == [16, 64, 128]
    for bad in ("1,1", "0,8", "8,129", "x", "", [], [1.5], [True], list(range(1, 17))):
        assert batch_size_list(bad, 128) is None, bad
    assert batch_size_list(list(range(1, 16)), 128) == list(range(1, 16)) + [128]


def test_a_padded_batch_gives_each_request_its_own_rows():
    """Three requests of 1, 2 and 2 rows make one batch of 5 rows, run padded to 8 (zeros); each
    request gets its rows of the output, none of the padding."""
    import asyncio

    from kiln.serve import Batcher, Runners, _Series

    seen = []

    def run(inputs):
        seen.append(inputs["x"].copy())
        return {"y": inputs["x"] * 2 + 1}

    async def main():
        batcher = Batcher(Runners([("0", run)]), 8, 0.2, _Series("padded", ["0"]), batch_sizes=[1, 2, 4, 8])
        batcher.start()
        answers = []
        # Then 2 + 1 rows, padded to 4 in the array the first batch was gathered in: its fourth row
        # held the first batch's data, and must be zero again.
        for sizes in ((1, 2, 2), (2, 1)):
            parts = [np.full((rows, 3), 10 * len(answers) + i + 1, np.float32) for i, rows in enumerate(sizes)]
            answers.append((parts, await asyncio.gather(*(batcher.submit({"x": p}, len(p)) for p in parts))))
        return answers

    answers = asyncio.run(main())
    assert [len(x) for x in seen] == [8, 4]
    np.testing.assert_array_equal(seen[0][5:], 0)
    np.testing.assert_array_equal(seen[1][3:], 0)
    np.testing.assert_array_equal(seen[1][:3], [[11] * 3, [11] * 3, [12] * 3])
    for parts, got in answers:
        for p, a in zip(parts, got):
            np.testing.assert_array_equal(a["y"], p * 2 + 1)


def test_a_context_takes_a_batch_in_pieces_with_its_padding_rows():
    """A GPU context's run takes a batch of several requests as pieces and the zero rows to pad
    with (Context.run_concatenated: no host-side concatenation); a request alone and unpadded
    goes to run() as it is."""
    import asyncio

    from kiln.serve import Batcher, Runners, _Series

    calls = []

    def run(inputs):
        calls.append(("run", [len(inputs["x"])]))
        return {"y": inputs["x"] + 1}

    def run_pieces(pieces, zero_rows):
        calls.append(("pieces", [len(p) for p in pieces["x"]], zero_rows))
        joined = np.concatenate(pieces["x"] + [np.zeros((zero_rows, 2), np.float32)])
        return {"y": joined + 1}

    async def main():
        batcher = Batcher(Runners([("0", run, run_pieces)]), 8, 0.2, _Series("pieces", ["0"]), batch_sizes=[1, 2, 4, 8])
        batcher.start()
        parts = [np.full((rows, 2), i, np.float32) for i, rows in enumerate((1, 2))]
        together = await asyncio.gather(*(batcher.submit({"x": p}, len(p)) for p in parts))
        alone = await batcher.submit({"x": np.full((2, 2), 7, np.float32)}, 2)
        return parts, together, alone

    parts, together, alone = asyncio.run(main())
    assert calls == [("pieces", [1, 2], 1), ("run", [2])]
    for p, a in zip(parts, together):
        np.testing.assert_array_equal(a["y"], p + 1)
    np.testing.assert_array_equal(alone["y"], 8)


def test_requests_queued_while_the_runs_are_busy_leave_as_one_batch():
    """With no queue delay, a request goes at once when a run is free; those that arrive while
    every run is busy leave together when one frees."""
    import asyncio

    from kiln.serve import Batcher, Runners, _Series

    seen, release = [], threading.Event()

    def run(inputs):
        seen.append(len(inputs["x"]))
        release.wait(30)
        return {"y": inputs["x"] + 1}

    async def main():
        batcher = Batcher(Runners([("0", run)]), 8, 0.0, _Series("busy", ["0"]))
        batcher.start()
        first = asyncio.ensure_future(batcher.submit({"x": np.zeros((1, 2), np.float32)}, 1))
        while not seen:
            await asyncio.sleep(0.01)
        later = [asyncio.ensure_future(batcher.submit({"x": np.full((2, 2), i, np.float32)}, 2)) for i in range(3)]
        await asyncio.sleep(0.2)
        release.set()
        return await first, await asyncio.gather(*later)

    first, later = asyncio.run(main())
    assert seen == [1, 6]
    np.testing.assert_array_equal(first["y"], 1)
    for i, answer in enumerate(later):
        np.testing.assert_array_equal(answer["y"], i + 1)


def test_a_request_past_grpcs_default_message_size_is_answered(kiln_bin, tmp_path):
    """gRPC's servers take 4 to 8 MiB a message unless told: kiln serve takes --max-request-mb."""
    path = os.path.join(DATA, "image_means.onnx")  # image: float32[N, 3, 224, 224] -> mean: float32[N, 3]
    s = Server(kiln_bin, [path, "--max-batch", "32"], str(tmp_path / "server.log"))
    try:
        images = np.random.default_rng(2).standard_normal((16, 3, 224, 224)).astype(np.float32)  # 9.6 MB
        import tritonclient.grpc as grpc

        inp = grpc.InferInput("image", list(images.shape), "FP32")
        inp.set_data_from_numpy(images)
        got = grpc.InferenceServerClient(f"localhost:{s.grpc_port}").infer("image_means", [inp]).as_numpy("mean")
        np.testing.assert_allclose(got, images.mean(axis=(2, 3)), rtol=1e-5, atol=1e-6)
    finally:
        assert s.stop() == 0, s.output()


def test_requests_past_the_size_limit_are_refused_without_being_read_whole(kiln_bin, tmp_path):
    """--max-request-mb 1: inputs past it are refused (HTTP 400, gRPC INVALID_ARGUMENT); an HTTP
    body past 8 times it is refused (413) by its Content-Length, or while a chunked one arrives;
    then a request within it is answered."""
    import http.client

    import tritonclient.grpc as grpc
    import tritonclient.http as thttp
    from tritonclient.utils import InferenceServerException

    path = os.path.join(DATA, "image_means.onnx")  # image: float32[N, 3, 224, 224] -> mean: float32[N, 3]
    s = Server(kiln_bin, [path, "--max-batch", "8", "--max-request-mb", "1"], str(tmp_path / "server.log"))
    try:
        images = np.random.default_rng(3).standard_normal((2, 3, 224, 224)).astype(np.float32)  # 1.2 MB
        for lib, client in ((thttp, thttp.InferenceServerClient(s.url)),
                            (grpc, grpc.InferenceServerClient(f"localhost:{s.grpc_port}"))):
            inp = lib.InferInput("image", list(images.shape), "FP32")
            inp.set_data_from_numpy(images)
            with pytest.raises(InferenceServerException, match="more than the server takes"):
                client.infer("image_means", [inp])
        limit = 8 * (1 << 20) + (1 << 20)
        conn = http.client.HTTPConnection("localhost", s.http_port, timeout=60)
        conn.putrequest("POST", "/v2/models/image_means/infer")
        conn.putheader("Content-Length", str(limit + 1))
        conn.endheaders()  # the body is never sent: the length alone is refused
        r = conn.getresponse()
        assert r.status == 413 and "more than the server reads" in r.read().decode()
        conn.close()
        conn = http.client.HTTPConnection("localhost", s.http_port, timeout=60)
        chunk = b" " * (1 << 20)
        conn.request("POST", "/v2/models/image_means/infer", body=(chunk for _ in range(12)), encode_chunked=True,
                     headers={"Transfer-Encoding": "chunked"})
        r = conn.getresponse()
        assert r.status == 413 and "more than the server reads" in r.read().decode()
        conn.close()
        inp = grpc.InferInput("image", [1, 3, 224, 224], "FP32")
        inp.set_data_from_numpy(images[:1])
        got = grpc.InferenceServerClient(f"localhost:{s.grpc_port}").infer("image_means", [inp]).as_numpy("mean")
        np.testing.assert_allclose(got, images[:1].mean(axis=(2, 3)), rtol=1e-5, atol=1e-6)
    finally:
        assert s.stop() == 0, s.output()


def test_a_port_in_use_is_refused_before_loading(kiln_bin):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([kiln_bin, "serve", CLASSIFIER, "--http-port", str(port), "--grpc-port", str(_free_port())],
                           capture_output=True, text=True, timeout=120, env=dict(os.environ, KILN_PYTHON=sys.executable))
    assert r.returncode == 1 and f"--http-port {port}: the port is in use" in r.stderr, r.stderr


def test_runs_spread_over_devices_by_their_runs_in_flight():
    """Two GPUs with two contexts each: the second of two batches in flight goes to the other GPU,
    and four in flight take both contexts of both."""
    from kiln.serve import Runners, _Pending

    started, release = [], threading.Event()
    one_row = [_Pending({"x": np.zeros((1, 2), np.float32)}, 1, None, 0.0)]

    def make(device):
        def run(inputs):
            started.append(device)
            release.wait(30)
            return {}
        return run

    runners = Runners([(d, make(d)) for d in ("0", "0", "1", "1")])
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = []
        for n in range(1, 5):
            futures.append(pool.submit(runners, one_row, 1, 1))
            deadline = time.monotonic() + 10
            while len(started) < n and time.monotonic() < deadline:
                time.sleep(0.01)
            if n == 2:
                assert sorted(started) == ["0", "1"]
        assert sorted(started) == ["0", "0", "1", "1"]
        release.set()
        assert sorted(f.result(30)[0] for f in futures) == ["0", "0", "1", "1"]


def test_sigterm_ends_the_server(kiln_bin, tmp_path):
    s = Server(kiln_bin, [CLASSIFIER], str(tmp_path / "server.log"))
    start = time.monotonic()
    assert s.stop() == 0, s.output()
    assert time.monotonic() - start < 30
