"""`kiln serve --grpc-front native` (src/serve/grpc_front.h) against requests no well-behaved client
sends, built by hand from the protocol's messages: each is refused with the status and a message
naming what is wrong, and the server keeps answering; typed contents (instead of raw bytes) are
served as the engine computes them; bytes that are no message at all are refused by gRPC itself.

Runs in the serving environment (.venv-serve) as tests/e2e/test_serve.py, whose Server it uses.
"""
from __future__ import annotations

import os

import grpc
import numpy as np
import pytest
from test_serve import CLASSIFIER, DATA, Server

import kiln


@pytest.fixture(scope="module")
def native(kiln_bin, tmp_path_factory):
    s = Server(kiln_bin, [CLASSIFIER, "--max-batch", "4", "--grpc-front", "native"],
               str(tmp_path_factory.mktemp("serve") / "server.log"))
    channel = grpc.insecure_channel(f"localhost:{s.grpc_port}")
    yield s, channel
    channel.close()
    assert s.stop() == 0, s.output()


def _stub(channel):
    from tritonclient.grpc import service_pb2_grpc

    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _request(shape=(1, 4), raw: list[bytes] | None = None, model="dynamic_classifier", datatype="FP32", **input_fields):
    from tritonclient.grpc import service_pb2 as pb

    r = pb.ModelInferRequest(model_name=model)
    tensor = r.inputs.add(name=input_fields.pop("name", "x"), datatype=datatype, shape=list(shape))
    for key, value in input_fields.items():
        getattr(tensor, key).CopyFrom(value) if hasattr(value, "ListFields") else setattr(tensor, key, value)
    if raw is None:
        raw = [np.ones(shape, np.float32).tobytes()] if all(d >= 0 for d in shape) and np.prod(shape) < 1e6 else []
    r.raw_input_contents.extend(raw)
    return r


def _answer(channel, x: np.ndarray) -> np.ndarray:
    answer = _stub(channel).ModelInfer(_request(x.shape, [x.tobytes()]), timeout=30)
    return np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(list(answer.outputs[0].shape))


def _bad_requests():
    from tritonclient.grpc import service_pb2 as pb

    contents = pb.InferTensorContents(fp32_contents=[1.0, 2.0, 3.0])
    wrong_output = _request()
    wrong_output.outputs.add(name="z")
    two_raw = _request()
    two_raw.raw_input_contents.append(b"\0" * 16)
    region = _request(raw=[])
    region.inputs[0].parameters["shared_memory_region"].string_param = "nowhere"
    region.inputs[0].parameters["shared_memory_byte_size"].int64_param = 16
    negative_size = _request(raw=[])
    negative_size.inputs[0].parameters["shared_memory_region"].string_param = "nowhere"
    negative_size.inputs[0].parameters["shared_memory_byte_size"].int64_param = -1
    return [
        (_request(model="no_such_model"), grpc.StatusCode.NOT_FOUND, "no model 'no_such_model'"),
        (_request(raw=[b"\0" * 15]), grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents hold 15"),
        (two_raw, grpc.StatusCode.INVALID_ARGUMENT, "2 raw_input_contents for 1 inputs"),
        (_request(shape=(-1, 4), raw=[b""]), grpc.StatusCode.INVALID_ARGUMENT, "must have shape"),
        (_request(shape=(1, 4, 1)), grpc.StatusCode.INVALID_ARGUMENT, "must have shape"),
        (_request(shape=(2**62, 4), raw=[b""]), grpc.StatusCode.INVALID_ARGUMENT, "input 'x'"),
        (_request(shape=(5, 4)), grpc.StatusCode.INVALID_ARGUMENT, "takes at most 4"),
        (_request(datatype="FP16", raw=[b"\0" * 8]), grpc.StatusCode.INVALID_ARGUMENT, "must be FP32, not FP16"),
        (_request(name="y"), grpc.StatusCode.INVALID_ARGUMENT, "has no input 'y'"),
        (wrong_output, grpc.StatusCode.INVALID_ARGUMENT, "has no output 'z'"),
        (_request(raw=[], contents=contents), grpc.StatusCode.INVALID_ARGUMENT, "3 values in contents for 4 elements"),
        (region, grpc.StatusCode.INVALID_ARGUMENT, "no shared-memory region 'nowhere'"),
        (negative_size, grpc.StatusCode.INVALID_ARGUMENT, "shared_memory_byte_size must be a whole number"),
    ]


def test_hostile_requests_are_refused_with_their_reason_and_the_server_keeps_answering(native):
    server, channel = native
    stub = _stub(channel)
    engine = kiln.Engine.from_onnx(CLASSIFIER)
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    for request, code, why in _bad_requests():
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(request, timeout=30)
        assert e.value.code() == code and why in e.value.details(), (why, e.value.code(), e.value.details())
        np.testing.assert_allclose(_answer(channel, x), engine.run({"x": x})["y"], rtol=1e-6)
    assert server.metric("kiln_errors_total", "dynamic_classifier") >= len(_bad_requests()) - 1


def test_typed_contents_are_served_as_the_engine_computes_them(native):
    from tritonclient.grpc import service_pb2 as pb

    _, channel = native
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    request = _request(x.shape, raw=[], contents=pb.InferTensorContents(fp32_contents=x.reshape(-1).tolist()))
    answer = _stub(channel).ModelInfer(request, timeout=30)
    y = np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(3, 3)
    np.testing.assert_allclose(y, kiln.Engine.from_onnx(CLASSIFIER).run({"x": x})["y"], rtol=1e-6)


def test_bytes_that_are_no_message_are_refused_and_the_server_keeps_answering(native):
    _, channel = native
    rng = np.random.default_rng(9)
    raw_call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                   request_serializer=lambda b: b, response_deserializer=lambda b: b)
    for size in (1, 7, 64, 4096):
        garbage = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        try:
            raw_call(garbage, timeout=30)
        except grpc.RpcError as e:
            assert e.code() != grpc.StatusCode.UNAVAILABLE, e.details()  # refused, not a server gone
    x = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(_answer(channel, x), kiln.Engine.from_onnx(CLASSIFIER).run({"x": x})["y"], rtol=1e-6)


def test_a_region_registered_over_one_protocol_serves_requests_over_the_other(native):
    """With the native front, HTTP and gRPC share one registry of shared-memory regions: a region
    registered over HTTP holds a gRPC request's input and output, one registered over gRPC an HTTP
    request's, and each protocol's status lists the other's registrations."""
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
    import tritonclient.utils.shared_memory as shm

    server, _ = native
    engine = kiln.Engine.from_onnx(CLASSIFIER)
    h = thttp.InferenceServerClient(server.url)
    g = tgrpc.InferenceServerClient(f"localhost:{server.grpc_port}")
    key = f"/kiln_native_{os.getpid()}"
    handle = shm.create_shared_memory_region(key.strip("/"), key, 64 + 48)
    try:
        for registrar, infer_lib, client in ((h, tgrpc, g), (g, thttp, h)):
            registrar.register_system_shared_memory("both", key, 64 + 48)
            listed = h.get_system_shared_memory_status()
            assert [r["name"] for r in listed] == ["both"]
            assert list(g.get_system_shared_memory_status().regions) == ["both"]
            x = np.random.default_rng(len(listed)).standard_normal((4, 4)).astype(np.float32)
            shm.set_shared_memory_region(handle, [x])
            inp = infer_lib.InferInput("x", [4, 4], "FP32")
            inp.set_shared_memory("both", 64)
            out = infer_lib.InferRequestedOutput("y")
            out.set_shared_memory("both", 48, offset=64)
            client.infer("dynamic_classifier", [inp], outputs=[out])
            got = shm.get_contents_as_numpy(handle, np.float32, [4, 3], offset=64)
            np.testing.assert_allclose(got, engine.run({"x": x})["y"], rtol=1e-6)
            client.unregister_system_shared_memory("both")
            assert not h.get_system_shared_memory_status()
    finally:
        shm.destroy_shared_memory_region(handle)


def test_sigterm_answers_the_requests_the_front_holds_first(kiln_bin, tmp_path):
    """A request queued in the native front's batcher (waiting out a long queue delay) when the
    server gets SIGTERM is answered, with the engine's outputs, before the server exits cleanly."""
    import queue as queues
    import signal
    import time

    import tritonclient.grpc as tgrpc

    s = Server(kiln_bin, [CLASSIFIER, "--max-batch", "16", "--max-queue-delay-us", "2000000", "--grpc-front", "native"],
               str(tmp_path / "server.log"))
    client = tgrpc.InferenceServerClient(f"localhost:{s.grpc_port}")
    answers: queues.Queue = queues.Queue()
    x = np.random.default_rng(13).standard_normal((2, 4)).astype(np.float32)
    inp = tgrpc.InferInput("x", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    try:
        client.async_infer("dynamic_classifier", [inp], callback=lambda result, error: answers.put((result, error)))
        time.sleep(0.5)  # the request waits in the queue for its delay
        assert answers.empty()
        s.proc.send_signal(signal.SIGTERM)
        result, error = answers.get(timeout=30)
        assert error is None, error
        np.testing.assert_allclose(result.as_numpy("y"), kiln.Engine.from_onnx(CLASSIFIER).run({"x": x})["y"], rtol=1e-6)
        assert s.proc.wait(60) == 0, s.output()
    finally:
        client.close()
        s.stop()


def test_many_http_requests_at_once_batch_in_the_native_front(kiln_bin, tmp_path):
    """HTTP requests wait for the native front's batcher on threads of their own, enough for all
    of them: 48 one-row requests sent at once (within the queue delay) run as a few full batches,
    not as many small ones behind a pool of a few threads."""
    import concurrent.futures
    import threading

    import tritonclient.http as thttp

    s = Server(kiln_bin, [CLASSIFIER, "--max-batch", "16", "--max-queue-delay-us", "400000", "--grpc-front", "native"],
               str(tmp_path / "server.log"))
    engine = kiln.Engine.from_onnx(CLASSIFIER)
    try:
        runs_before = s.metric("kiln_batch_size_count", "dynamic_classifier")
        xs = [np.random.default_rng(100 + i).standard_normal((1, 4)).astype(np.float32) for i in range(48)]
        start = threading.Barrier(len(xs))

        def send(x):
            client = thttp.InferenceServerClient(s.url)
            inp = thttp.InferInput("x", [1, 4], "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            start.wait()
            return client.infer("dynamic_classifier", [inp]).as_numpy("y")

        with concurrent.futures.ThreadPoolExecutor(len(xs)) as pool:
            answers = list(pool.map(send, xs))
        for x, y in zip(xs, answers):
            np.testing.assert_allclose(y, engine.run({"x": x})["y"], rtol=1e-6)
        runs = s.metric("kiln_batch_size_count", "dynamic_classifier") - runs_before
        assert 3 <= runs <= 6, f"48 one-row requests ran as {runs} engine runs of at most 16 rows"
    finally:
        s.stop()


def test_a_stream_whose_client_takes_no_answers_is_read_no_further(kiln_bin, tmp_path):
    """A client streams 400 requests of 256 KB answers without reading any: the front reads at most
    its window of unanswered requests (128) and what the transports hold, not all 400, so such a
    client cannot fill the server's memory; once the client reads, every answer comes, in order."""
    import time

    from tritonclient.grpc import service_pb2 as pb

    s = Server(kiln_bin, [os.path.join(DATA, "wide_identity.onnx"), "--max-batch", "8", "--grpc-front", "native"],
               str(tmp_path / "server.log"))
    channel = grpc.insecure_channel(f"localhost:{s.grpc_port}")
    try:
        def requests():
            for i in range(400):
                r = pb.ModelInferRequest(model_name="wide_identity", id=str(i))
                r.inputs.add(name="x", datatype="FP32", shape=[1, 65536])
                r.raw_input_contents.append(np.full((1, 65536), i, np.float32).tobytes())
                yield r

        answers = _stub(channel).ModelStreamInfer(requests(), timeout=120)
        taken, stable_since = -1.0, time.monotonic()
        while time.monotonic() - stable_since < 2.0:  # until the server has read nothing for 2 s
            time.sleep(0.2)
            now = s.metric("kiln_requests_total", "wide_identity")
            if now != taken:
                taken, stable_since = now, time.monotonic()
        assert 128 <= taken <= 200, f"the front read {taken} of 400 requests whose answers nobody took"
        for i, answer in enumerate(answers):
            assert answer.error_message == "" and answer.infer_response.id == str(i)
            y = np.frombuffer(answer.infer_response.raw_output_contents[0], np.float32)
            assert y.shape == (65536,) and (y == i).all()
        assert i == 399
        assert s.metric("kiln_requests_total", "wide_identity") == 400
    finally:
        channel.close()
        assert s.stop() == 0, s.output()


def test_infer_load_counts_what_the_server_counts(native, kiln_bin):
    """bench/infer_load (serve_bench.py --load-generator cpp, built with the native front): requests
    kept in flight, in the message, in shared memory and on one or several streams, each answered
    request counted once, as the server counts them; a request the server refuses is an error with
    its reason."""
    import json
    import subprocess

    binary = os.path.join(os.path.dirname(kiln_bin), "bench", "infer_load")
    assert os.access(binary, os.X_OK), f"{binary} is built beside the native front (ninja -C build infer_load)"
    s, _ = native

    def load(*flags, shape="2,4"):
        r = subprocess.run([binary, "--url", f"127.0.0.1:{s.grpc_port}", "--model", "dynamic_classifier", "--input",
                            "x", "--shape", shape, "--concurrency", "4", "--seconds", "0.5", "--warmup", "0", *flags],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout), r.stderr

    for flags in ([], ["--shared-memory", "system"], ["--stream"], ["--stream", "--streams", "3"]):
        before = s.metric("kiln_requests_total", "dynamic_classifier")
        got, _ = load(*flags)
        after = s.metric("kiln_requests_total", "dynamic_classifier")
        assert got["errors"] == 0 and got["requests"] > 10, (flags, got)
        assert after - before == got["requests"], (flags, got, after - before)
        assert got["throughput_per_s"] == pytest.approx(got["requests"] * 2 / 0.5)
        assert 0 < got["latency_ms"]["p50"] <= got["latency_ms"]["p99"]

    errors_before = s.metric("kiln_errors_total", "dynamic_classifier")
    got, stderr = load(shape="2,5")
    assert got["requests"] == 0 and got["errors"] > 0
    assert "must have shape [-1, 4]" in stderr
    assert s.metric("kiln_errors_total", "dynamic_classifier") - errors_before == got["errors"]

    r = subprocess.run([binary, "--url", f"127.0.0.1:{s.grpc_port}", "--model", "no_such_model", "--input", "x",
                        "--shape", "1,4"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no_such_model" in r.stderr
