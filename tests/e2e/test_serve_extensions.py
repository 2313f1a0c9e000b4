"""`kiln serve`'s protocol extensions through Triton's clients: system shared memory (inputs read
and outputs written in a region the client registered, over HTTP and gRPC, hostile registrations
and requests refused while the server keeps serving) and gRPC stream inference (ModelStreamInfer:
each request of a stream answered, in order, an error answering only its own request), and a
region the GPU cannot pin served unpinned.

Runs in the serving environment (.venv-serve) as tests/e2e/test_serve.py, whose Server it uses.
"""
from __future__ import annotations

import os
import queue
import uuid

import numpy as np
import pytest
from test_serve import CLASSIFIER, DATA, FRONTS, Server

import kiln

IMAGE_MEANS = os.path.join(DATA, "image_means.onnx")  # image: float32[N, 3, 224, 224] -> mean: float32[N, 3]
SLOW_PRODUCTS = os.path.join(DATA, "slow_products.onnx")  # x: float32[N, 512, 512] -> y: float32[N] (its mean), ~13 GFLOP a row


@pytest.fixture(scope="module", params=FRONTS)
def server(kiln_bin, tmp_path_factory, request):
    s = Server(kiln_bin, [IMAGE_MEANS, "--max-batch", "8", "--grpc-front", request.param],
               str(tmp_path_factory.mktemp("serve") / "server.log"))
    yield s
    assert s.stop() == 0, s.output()


class Shm:
    """A POSIX shared-memory object of the client's (tritonclient.utils.shared_memory), removed after."""

    def __init__(self, byte_size: int):
        import tritonclient.utils.shared_memory as shm

        self.module = shm
        self.key = f"/kiln_test_{uuid.uuid4().hex[:12]}"
        self.handle = shm.create_shared_memory_region(self.key.strip("/"), self.key, byte_size)

    def put(self, array: np.ndarray, offset: int = 0) -> None:
        self.module.set_shared_memory_region(self.handle, [array], offset=offset)

    def get(self, dtype, shape, offset: int = 0) -> np.ndarray:
        return self.module.get_contents_as_numpy(self.handle, dtype, shape, offset=offset)

    def close(self) -> None:
        self.module.destroy_shared_memory_region(self.handle)


@pytest.fixture
def regions():
    made = []

    def make(byte_size: int) -> Shm:
        made.append(Shm(byte_size))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _images(seed: int, rows: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 3, 224, 224)).astype(np.float32)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_shared_memory_are_the_engines(server, regions, protocol):
    import tritonclient.grpc as grpc
    import tritonclient.http as http

    lib = http if protocol == "http" else grpc
    client = (http.InferenceServerClient(server.url) if protocol == "http"
              else grpc.InferenceServerClient(f"localhost:{server.grpc_port}"))
    images = _images(1, 3)
    expected = kiln.Engine.from_onnx(IMAGE_MEANS).run({"image": images})["mean"]
    inputs, outputs = regions(images.nbytes + 4096), regions(4096)
    inputs.put(images, offset=4096)  # an offset into the region
    client.unregister_system_shared_memory()
    client.register_system_shared_memory("in", inputs.key, images.nbytes + 4096)
    client.register_system_shared_memory("out", outputs.key, 4096)
    status = client.get_system_shared_memory_status()
    names = sorted(r["name"] for r in status) if protocol == "http" else sorted(status.regions)
    assert names == ["in", "out"]

    inp = lib.InferInput("image", list(images.shape), "FP32")
    inp.set_shared_memory("in", images.nbytes, offset=4096)
    out = lib.InferRequestedOutput("mean")
    out.set_shared_memory("out", 4096)
    result = client.infer("image_means", [inp], outputs=[out])
    answered = result.get_output("mean")
    shape = answered["shape"] if protocol == "http" else list(answered.shape)
    assert shape == [3, 3]
    np.testing.assert_allclose(outputs.get(np.float32, [3, 3]), expected, rtol=1e-6, atol=1e-6)

    # An input in shared memory with an output in the answer, many times (the region is read in place).
    for seed in range(2, 6):
        images = _images(seed, 3)
        inputs.put(images, offset=4096)
        got = client.infer("image_means", [inp]).as_numpy("mean")
        np.testing.assert_allclose(got, images.mean(axis=(2, 3)), rtol=1e-5, atol=1e-6)
    client.unregister_system_shared_memory("in")
    client.unregister_system_shared_memory("out")
    assert not (client.get_system_shared_memory_status() if protocol == "http"
                else client.get_system_shared_memory_status().regions)


def test_hostile_registrations_and_requests_are_refused_and_the_server_keeps_serving(server, regions):
    import tritonclient.grpc as grpc
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    h = http.InferenceServerClient(server.url)
    g = grpc.InferenceServerClient(f"localhost:{server.grpc_port}")
    small = regions(1024)
    refusals = [
        (lambda c: c.register_system_shared_memory("a", "/../../etc/passwd", 16), "is not the name of"),
        (lambda c: c.register_system_shared_memory("a", "/kiln_no_such_object", 16), "cannot open"),
        (lambda c: c.register_system_shared_memory("a", small.key, 2048), "past the end"),
        (lambda c: c.register_system_shared_memory("a", small.key, 512, offset=1000), "past the end"),
        (lambda c: c.get_system_shared_memory_status("nothing"), "no shared-memory region 'nothing'"),
    ]
    for client in (h, g):
        for attempt, why in refusals:
            with pytest.raises(InferenceServerException, match=why):
                attempt(client)
        client.register_system_shared_memory("small", small.key, 1024)
        with pytest.raises(InferenceServerException, match="already registered"):
            client.register_system_shared_memory("small", small.key, 1024)
        lib = http if client is h else grpc
        image = _images(7, 1)
        requests = [
            ("small", 1024, 0, "shape \\[1, 3, 224, 224\\] of float32 is 602112 bytes"),  # region too small
            ("small", 602112, 0, "past the end of region 'small'"),
            ("missing", 602112, 0, "no shared-memory region 'missing'"),
        ]
        for region, size, offset, why in requests:
            inp = lib.InferInput("image", [1, 3, 224, 224], "FP32")
            inp.set_shared_memory(region, size, offset=offset)
            with pytest.raises(InferenceServerException, match=why):
                client.infer("image_means", [inp])
        client.unregister_system_shared_memory()
        inp = lib.InferInput("image", list(image.shape), "FP32")
        inp.set_data_from_numpy(image)
        np.testing.assert_allclose(client.infer("image_means", [inp]).as_numpy("mean"), image.mean(axis=(2, 3)),
                                   rtol=1e-5, atol=1e-6)


def test_a_region_the_gpu_cannot_pin_is_served_unpinned(regions, caplog):
    """A server of GPU models pins each object a client registers; where the driver refuses (here a
    GPU that does not exist: no machine has GPU 99), the region is still registered, a warning names
    it, and inputs read from it are what the client wrote."""
    from kiln import shared_memory

    with pytest.raises(kiln.Error, match="GPU 99|CUDA"):
        kiln.PinnedHostMemory(bytearray(4096), gpu=99)
    images = _images(5, 2)
    region = regions(images.nbytes)
    region.put(images)
    served = shared_memory.Regions()
    served.pin_gpu = 99
    with caplog.at_level("WARNING", logger="kiln.serve"):
        served.register("frames", region.key, 0, images.nbytes)
    assert any("'frames' is not pinned for the GPU" in r.getMessage() for r in caplog.records)
    got = served.read({"shared_memory_region": "frames", "shared_memory_byte_size": images.nbytes},
                      np.dtype(np.float32), list(images.shape), "input 'image'")
    np.testing.assert_array_equal(got, images)
    served.unregister()


@pytest.mark.parametrize("front", FRONTS)
def test_a_stream_of_requests_is_answered_in_order(kiln_bin, tmp_path, front):
    """ModelStreamInfer: a client streams 40 requests of 1 to 3 rows without waiting; each answer
    is its request's, in the order sent; a request with a wrong shape is answered with its error
    and the stream goes on."""
    import tritonclient.grpc as grpc

    s = Server(kiln_bin, [CLASSIFIER, "--max-batch", "16", "--instances", "1", "--grpc-front", front],
               str(tmp_path / "server.log"))
    engine = kiln.Engine.from_onnx(CLASSIFIER)
    answers: queue.Queue = queue.Queue()
    client = grpc.InferenceServerClient(f"localhost:{s.grpc_port}")
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        sent = []
        for i in range(40):
            x = np.random.default_rng(i).standard_normal((1 + i % 3, 5 if i == 17 else 4)).astype(np.float32)
            inp = grpc.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            client.async_stream_infer("dynamic_classifier", [inp], request_id=str(i))
            sent.append(x)
        for i, x in enumerate(sent):
            result, error = answers.get(timeout=60)
            if i == 17:
                assert result is None and "input 'x' must have shape" in str(error)
                continue
            assert error is None, error
            assert result.get_response().id == str(i)
            np.testing.assert_allclose(result.as_numpy("y"), engine.run({"x": x})["y"], rtol=1e-5, atol=1e-6)
        client.stop_stream()
    finally:
        client.close()
        assert s.stop() == 0, s.output()


@pytest.mark.parametrize("front", FRONTS)
def test_requests_past_max_queue_are_refused_at_once_and_the_server_goes_on(kiln_bin, tmp_path, front):
    """--max-queue 1: of ten requests sent together (HTTP and gRPC) to a model whose run takes a
    good fraction of a second, those that find one request waiting already are refused at once
    (HTTP 503, gRPC UNAVAILABLE) naming the flag; each refusal counts as an error; the requests
    taken are answered, and so is one sent afterwards."""
    import concurrent.futures
    import threading
    import time

    import tritonclient.grpc as grpc
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    s = Server(kiln_bin, [SLOW_PRODUCTS, "--max-batch", "1", "--max-queue", "1", "--instances", "1", "--grpc-front", front],
               str(tmp_path / "server.log"))
    x = np.full((1, 512, 512), 0.5, np.float32)
    start = threading.Barrier(10)

    def send(i: int):
        kind = grpc if i % 2 else http
        client = kind.InferenceServerClient(f"localhost:{s.grpc_port}" if i % 2 else s.url)
        inp = kind.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        start.wait()
        began = time.monotonic()
        try:
            return "answered", client.infer("slow_products", [inp]).as_numpy("y"), time.monotonic() - began
        except InferenceServerException as e:
            return str(e.status()), e.message(), time.monotonic() - began

    try:
        errors_before = s.metric("kiln_errors_total", "slow_products")
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            results = list(pool.map(send, range(10)))
        answered = [r for r in results if r[0] == "answered"]
        refused = [r for r in results if r[0] != "answered"]
        assert answered and refused, results
        for _, y, _ in answered:
            np.testing.assert_allclose(y, [0.5], rtol=1e-6)  # (products by the identity)
        for status, message, _ in refused:
            assert status in ("503", "StatusCode.UNAVAILABLE") and "--max-queue 1" in message, (status, message)
        assert s.metric("kiln_errors_total", "slow_products") - errors_before == len(refused)
        # Refused at once: sooner than the answers, which waited for a run.
        assert max(r[2] for r in refused) < max(r[2] for r in answered), results
        assert _infer_one(s, x) is not None  # the server goes on
    finally:
        assert s.stop() == 0, s.output()


def _infer_one(server, x: np.ndarray):
    import tritonclient.http as http

    client = http.InferenceServerClient(server.url)
    inp = http.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer("slow_products", [inp]).as_numpy("y")
