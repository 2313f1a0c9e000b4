"""`kiln serve --device cuda` on one GPU: an fp16 engine built from ONNX with a profile up to
--max-batch, cached beside the model and loaded from there next time; requests of any row count
answered like the CPU engine (batches padded to the planned sizes); many clients at once batched
over two contexts; inputs in a shared-memory region, which the server pins for the GPU; each of
these with KServe's gRPC front and with kiln's native one (--grpc-front native, whose batcher
runs the contexts); a GPU the machine does not have refused with one line (kiln serve, kiln build
and the Python API).

Needs the serving packages (KServe, tritonclient) on the GPU machine's Python: they travel as
wheels (docs/testing.md, "The GPU gate"); a missing one fails the suite, never skips it."""
from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import kiln  # noqa: E402  (a missing module fails the file, never skips it)
from serve_helpers import Server, _free_port, grpc_infer, rel_l2, runs_by_device

MAX_BATCH = 16


@pytest.fixture(scope="module", params=["kserve", "native"])
def served(kiln_bin, resnet18_64, tmp_path_factory, request):
    """ResNet-18 (64x64, dynamic batch) served in fp16 on GPU 0 with two contexts, through each gRPC
    front: (server, model path, spec, the CPU engine)."""
    path, spec = resnet18_64
    folder = tmp_path_factory.mktemp("served")
    model = str(folder / "resnet18.onnx")
    shutil.copy(path, model)
    s = Server(kiln_bin, [model, "--device", "cuda", "--fp16", "--max-batch", str(MAX_BATCH), "--instances", "2",
                          "--max-queue-delay-us", "20000", "--grpc-front", request.param], str(folder / "server.log"))
    s.front = request.param
    yield s, model, spec, kiln.Engine.from_onnx(path)
    assert s.stop() == 0, s.output()


def test_answers_match_the_cpu_engine_at_any_row_count(served):
    server, _, spec, cpu = served
    assert "on GPUs 0" in server.output()
    for rows in (1, 3, 5, MAX_BATCH):  # 3 and 5 run padded to 4 and 8
        x = spec.make_inputs(rows, rows)[0]
        got = grpc_infer(server, "resnet18", "input", x, "output")
        assert got.shape == (rows, 1000)
        assert rel_l2(got, cpu.run({"input": x})["output"]) < 1e-2


def test_many_clients_are_batched_and_each_gets_its_rows(served):
    server, _, spec, cpu = served

    def runs() -> float:
        return sum(runs_by_device(server, "resnet18").values())

    before = runs()
    requests = [spec.make_inputs(1 + i % 3, 100 + i)[0] for i in range(48)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda x: grpc_infer(server, "resnet18", "input", x, "output"), requests))
    for x, got in zip(requests, answers):
        assert got.shape == (len(x), 1000)
        assert rel_l2(got, cpu.run({"input": x})["output"]) < 1e-2
    if server.front == "kserve":
        assert set(runs_by_device(server, "resnet18")) == {"0"}
    assert 0 < runs() - before < len(requests)  # batched: fewer engine runs than requests


def test_inputs_in_shared_memory_go_to_the_gpu_from_the_region(served):
    """Inputs a client leaves in a system shared-memory region (pinned for the GPU at registration,
    so contexts copy them from there): each request, alone and batched with others, is answered
    like the CPU engine; the region is rewritten between rounds and the answers follow it."""
    import tritonclient.grpc as grpc
    import tritonclient.utils.shared_memory as shm

    server, _, spec, cpu = served
    client = grpc.InferenceServerClient(f"localhost:{server.grpc_port}")
    rows = [1, 2, 3, 1, 4, 2, 1, 2]
    image_bytes = 3 * 64 * 64 * 4
    offsets = [sum(rows[:i]) * image_bytes for i in range(len(rows))]
    key = f"/kiln_gpu_test_{os.getpid()}"
    handle = shm.create_shared_memory_region(key.strip("/"), key, sum(rows) * image_bytes)
    try:
        client.register_system_shared_memory("images", key, sum(rows) * image_bytes)

        def infer(i):
            inp = grpc.InferInput("input", [rows[i], 3, 64, 64], "FP32")
            inp.set_shared_memory("images", rows[i] * image_bytes, offset=offsets[i])
            return client.infer("resnet18", [inp]).as_numpy("output")

        for round_ in range(2):
            xs = [spec.make_inputs(r, 200 + 10 * round_ + i)[0] for i, r in enumerate(rows)]
            for x, offset in zip(xs, offsets):
                shm.set_shared_memory_region(handle, [x], offset=offset)
            with concurrent.futures.ThreadPoolExecutor(len(rows)) as pool:
                answers = list(pool.map(infer, range(len(rows))))
            for x, got in zip(xs, answers):
                assert got.shape == (len(x), 1000)
                assert rel_l2(got, cpu.run({"input": x})["output"]) < 1e-2
        client.unregister_system_shared_memory("images")
    finally:
        shm.destroy_shared_memory_region(handle)
    assert "not pinned" not in server.output()


def test_the_engine_is_cached_beside_the_model_and_loaded_from_there(served, kiln_bin, tmp_path):
    _, model, spec, cpu = served
    cached = model.replace(".onnx", f".fp16.b{MAX_BATCH}.engine")
    assert os.path.exists(cached)
    mtime = os.path.getmtime(cached)
    s = Server(kiln_bin, [model, "--device", "cuda", "--fp16", "--max-batch", str(MAX_BATCH)], str(tmp_path / "log"))
    try:
        x = spec.make_inputs(2, 7)[0]
        assert rel_l2(grpc_infer(s, "resnet18", "input", x, "output"), cpu.run({"input": x})["output"]) < 1e-2
    finally:
        assert s.stop() == 0, s.output()
    assert os.path.getmtime(cached) == mtime  # loaded, not built and written again


def test_a_gpu_the_machine_lacks_is_refused_with_one_line(kiln_bin, resnet18_64, tmp_path):
    import torch

    missing = torch.cuda.device_count()
    path, _ = resnet18_64
    r = subprocess.run([kiln_bin, "serve", path, "--device", "cuda", "--gpus", f"0,{missing}", "--http-port",
                        str(_free_port()), "--grpc-port", str(_free_port())], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, KILN_PYTHON=sys.executable))
    assert r.returncode == 1 and f"GPU {missing} does not exist" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([kiln_bin, "build", path, "--fp16", "--gpu", str(missing), "-o", str(tmp_path / "x.engine")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and f"GPU {missing} does not exist" in r.stderr, r.stderr
    engine = kiln.Builder(precision="fp16", device="cuda", shapes={"input": [2, 3, 64, 64]}).build(path)
    assert engine.gpu == 0 and engine.info()["gpu"] == 0
    saved = str(tmp_path / "r.engine")
    engine.save(saved)
    with pytest.raises(kiln.InvalidArgumentError, match=f"GPU {missing} does not exist"):
        kiln.Engine.load(saved, gpu=missing)
