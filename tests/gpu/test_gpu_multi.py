"""Several GPUs in one process: an engine built on GPU 1 keeps its memory there and runs there
whatever device the calling thread has current (and leaves that device current); one engine
file loaded on two GPUs gives the same outputs on each, driven from one thread; DLPack outputs
name their GPU; `kiln bench --gpu 1` runs on GPU 1; `kiln serve --gpus 0,1` spreads its batches
over both GPUs.

Needs two GPUs or more in view: the GPU gate runs this suite (multigpu) with every GPU of the
machine, after the one-GPU suites; with fewer it fails, never skips."""
from __future__ import annotations

import concurrent.futures
import json
import shutil
import subprocess

import numpy as np
import pytest

import kiln  # noqa: E402  (a missing module fails the file, never skips it)
from serve_helpers import Server, grpc_infer, rel_l2, runs_by_device


@pytest.fixture(scope="module", autouse=True)
def two_gpus():
    import torch

    assert torch.cuda.device_count() >= 2, "the multigpu suite needs two GPUs in view (CUDA_VISIBLE_DEVICES)"


def test_an_engine_lives_and_runs_on_its_gpu(resnet18_64, tmp_path):
    import torch

    path, spec = resnet18_64
    x = spec.make_inputs(8, 3)[0]
    want = kiln.Engine.from_onnx(path).run({"input": x})["output"]
    torch.cuda.set_device(0)
    torch.cuda.synchronize(0), torch.cuda.synchronize(1)
    free0, free1 = torch.cuda.mem_get_info(0)[0], torch.cuda.mem_get_info(1)[0]
    on1 = kiln.Builder(precision="fp16", device="cuda", shapes={"input": [8, 3, 64, 64]}, gpu=1).build(path)
    weights = on1.info()["weight_bytes"]
    assert on1.gpu == 1 and on1.info()["gpu"] == 1 and weights > 10 << 20
    assert free1 - torch.cuda.mem_get_info(1)[0] >= weights  # the weights went to GPU 1...
    assert free0 - torch.cuda.mem_get_info(0)[0] < weights // 2  # ...and not to GPU 0
    got1 = on1.run({"input": x})["output"]
    assert torch.cuda.current_device() == 0  # the caller's device is left as it was
    assert rel_l2(got1, want) < 1e-2

    saved = str(tmp_path / "resnet18.engine")
    on1.save(saved)
    on0 = kiln.Engine.load(saved, gpu=0)
    again1 = kiln.Engine.load(saved, gpu=1)
    assert (on0.gpu, again1.gpu) == (0, 1)
    c0, c1 = on0.create_context(), again1.create_context()
    torch.cuda.set_device(1)  # the thread's device is GPU 1; contexts still run where their engines are
    for seed in (4, 5, 6):
        xs = spec.make_inputs(8, seed)[0]
        a, b = c0.run({"input": xs})["output"], c1.run({"input": xs})["output"]
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)
        assert rel_l2(a, kiln.Engine.from_onnx(path).run({"input": xs})["output"]) < 1e-2
    assert torch.cuda.current_device() == 1
    torch.cuda.set_device(0)

    out = c1.run_torch({"input": torch.from_numpy(x).to("cuda:1")})["output"]
    torch.cuda.synchronize(1)
    assert out.device == torch.device("cuda", 1)  # DLPack names the engine's GPU
    assert rel_l2(out.cpu().numpy(), want) < 1e-2


def test_kiln_bench_on_the_second_gpu(kiln_bin, resnet18_64, tmp_path):
    path, _ = resnet18_64
    out = tmp_path / "bench.json"
    r = subprocess.run([kiln_bin, "bench", path, "--fp16", "--gpu", "1", "--batches", "4", "--iterations", "20",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    rows = result["results"] if isinstance(result, dict) else result
    assert [row["gpu"] for row in rows] == [1]


def test_serve_spreads_batches_over_two_gpus(kiln_bin, resnet18_64, tmp_path):
    path, spec = resnet18_64
    model = str(tmp_path / "resnet18.onnx")
    shutil.copy(path, model)
    s = Server(kiln_bin, [model, "--device", "cuda", "--fp16", "--gpus", "0,1", "--max-batch", "4",
                          "--max-queue-delay-us", "2000"], str(tmp_path / "server.log"))
    try:
        assert "on GPUs 0,1" in s.output()
        cpu = kiln.Engine.from_onnx(path)
        requests = [spec.make_inputs(1 + i % 2, 200 + i)[0] for i in range(96)]
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(lambda x: grpc_infer(s, "resnet18", "input", x, "output"), requests))
        for x, got in zip(requests, answers):
            assert rel_l2(got, cpu.run({"input": x})["output"]) < 1e-2
        runs = runs_by_device(s, "resnet18")
        assert set(runs) == {"0", "1"} and runs["0"] > 0 and runs["1"] > 0, runs
    finally:
        assert s.stop() == 0, s.output()
