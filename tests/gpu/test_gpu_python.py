"""The Python package on the GPU: a Builder's fp16 and INT8 engines against the CPU engine,
Context.run_torch on torch CUDA tensors through DLPack (outputs are views of the context's own
buffers: no copy), caller memory bound to inputs and outputs (Context.bind), the torch.compile
backend, engine files saved and loaded from Python. Needs the extension module built
for the GPU machine's Python (scripts/build_gpu_python.sh; PYTHONPATH=build-gpu/python)."""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest


import kiln  # noqa: E402  (a missing module fails the file, never skips it)


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_fp16_builder_and_run_torch_zero_copy(resnet18_64, tmp_path):
    import torch

    path, spec = resnet18_64
    assert kiln.has_cuda
    x = spec.make_inputs(8, 3)[0]
    want = kiln.Engine.from_onnx(path).run({"input": x})["output"]  # the CPU engine, float32
    engine = kiln.Builder(precision="fp16", device="cuda", shapes={"input": [8, 3, 64, 64]}).build(path)
    assert engine.backend == "cuda" and engine.info()["precision"] == "fp16"
    got = engine.run({"input": x})["output"]
    assert rel_l2(got, want) < 1e-2

    context = engine.create_context()
    out = context.run_torch({"input": torch.from_numpy(x).cuda()})["output"]
    torch.cuda.synchronize()
    assert out.is_cuda and out.shape == (8, 1000) and out.dtype == torch.float32
    assert out.data_ptr() == context.output_pointer("output")  # a view of the engine's buffer
    np.testing.assert_allclose(out.cpu().numpy(), got, rtol=1e-3, atol=1e-3)
    # Next inputs, same buffers, new values; on a stream of the caller's.
    x2 = spec.make_inputs(8, 4)[0]
    stream = torch.cuda.Stream()
    out2 = context.run_torch({"input": torch.from_numpy(x2).cuda()}, stream=stream)["output"]
    stream.synchronize()
    assert out2.data_ptr() == out.data_ptr()
    assert rel_l2(out2.cpu().numpy(), kiln.Engine.from_onnx(path).run({"input": x2})["output"]) < 1e-2

    saved = str(tmp_path / "resnet18.engine")
    engine.save(saved)
    loaded = kiln.Engine.load(saved)
    np.testing.assert_array_equal(loaded.run({"input": x})["output"], got)
    with pytest.raises(kiln.Error, match="shape|8x3x64x64"):
        engine.run({"input": spec.make_inputs(4, 3)[0]})


def test_int8_builder_calibrates_on_the_gpu_from_a_dataloader(resnet18_64):
    import torch

    path, spec = resnet18_64
    data = torch.utils.data.TensorDataset(torch.from_numpy(spec.make_inputs(64, 5)[0]))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    builder = kiln.Builder(precision="int8", device="cuda", shapes={"input": [16, 3, 64, 64]}, quantize_all=True)
    scales = builder.calibrate(path, loader, progress=False)
    assert len(scales) > 20
    engine = builder.build(path)
    assert sum(layer["op"] == "QConv" for layer in engine.info()["layers"]) >= 16
    x = spec.make_inputs(16, 9)[0]
    want = kiln.Engine.from_onnx(path).run({"input": x})["output"]
    got = engine.run({"input": x})["output"]
    # Random-weight ResNet-18: INT8's own error against float32 is about 9% on the CPU engine
    # (tests/gpu/test_gpu_int8.py); the GPU's may not be far from it.
    assert rel_l2(got, want) < 0.25


def test_dynamic_engine_from_python(resnet18_64, tmp_path):
    """A Builder with a profile: run_torch at several batches (the context follows the tensors'
    shapes; outputs are views at the current shape), set_input_shape's checks, and an engine file
    that keeps the profile."""
    import torch

    path, spec = resnet18_64
    builder = kiln.Builder(precision="fp16", device="cuda",
                           profiles=[{"input": ([1, 3, 64, 64], [4, 3, 64, 64], [8, 3, 64, 64])}])
    engine = builder.build(path)
    assert engine.inputs[0].shape == [-1, 3, 64, 64] and engine.outputs[0].shape == [-1, 1000]
    r = engine.profiles[0]["input"]
    assert (r.min, r.opt, r.max) == ([1, 3, 64, 64], [4, 3, 64, 64], [8, 3, 64, 64])
    cpu = kiln.Engine.from_onnx(path)
    context = engine.create_context()
    assert context.input_shape("input") == [4, 3, 64, 64]  # the opt shape until set
    pointer = None
    for batch in (2, 8, 1, 5):
        x = spec.make_inputs(batch, 30 + batch)[0]
        out = context.run_torch({"input": torch.from_numpy(x).cuda()})["output"]
        torch.cuda.synchronize()
        assert out.shape == (batch, 1000) and context.output_shape("output") == [batch, 1000]
        pointer = pointer or out.data_ptr()
        assert out.data_ptr() == pointer  # one buffer for every shape
        assert rel_l2(out.cpu().numpy(), cpu.run({"input": x})["output"]) < 1e-2
        assert rel_l2(engine.run({"input": x})["output"], cpu.run({"input": x})["output"]) < 1e-2
    with pytest.raises(kiln.Error, match="above the profile's max 8"):
        context.set_input_shape("input", [9, 3, 64, 64])
    with pytest.raises(kiln.Error, match="rank"):
        context.set_input_shape("input", [2, 3, 64])
    with pytest.raises(kiln.Error, match="no input named"):
        context.set_input_shape("image", [2, 3, 64, 64])
    with pytest.raises(kiln.Error, match="dtype float64, the engine expects float32"):
        context.run({"input": spec.make_inputs(2, 1)[0].astype(np.float64)})
    assert context.input_shape("input") == [5, 3, 64, 64]  # unchanged by the refused calls
    saved = str(tmp_path / "dynamic.engine")
    engine.save(saved)
    loaded = kiln.Engine.load(saved)
    assert loaded.inputs[0].shape == [-1, 3, 64, 64] and loaded.profiles[0]["input"].max == [8, 3, 64, 64]
    x = spec.make_inputs(3, 77)[0]
    np.testing.assert_allclose(loaded.run({"input": x})["output"], engine.run({"input": x})["output"], rtol=1e-2, atol=1e-2)


def test_torch_compile_backend_builds_an_fp16_engine_on_cuda_inputs():
    import torch
    import torchvision

    import kiln.torch_backend as kiln_torch

    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval().cuda()
    x = torch.randn(8, 3, 64, 64, device="cuda")
    before = kiln_torch.stats["engines"]
    with torch.no_grad():
        got = torch.compile(model, backend="kiln")(x)
        want = model(x)
    assert kiln_torch.stats["engines"] == before + 1
    assert got.is_cuda and got.dtype == torch.float32 and got.shape == (8, 1000)
    assert rel_l2(got.cpu().numpy(), want.cpu().numpy()) < 1e-2


def test_run_concatenated_is_run_of_the_joined_pieces(resnet18_64):
    """A batch given in pieces (a server's requests) with zero rows after them: the same outputs as
    run() of the pieces joined on the host; a piece's memory is read in place (a read-only array
    from bytes, a slice); pieces that do not continue each other, a wrong dtype, negative zero rows
    and a batch past the profile are refused, and the context runs on."""
    path, spec = resnet18_64
    engine = kiln.Builder(precision="fp16", device="cuda",
                          profiles=[{"input": ([1, 3, 64, 64], [8, 3, 64, 64], [8, 3, 64, 64])}]).build(path)
    context = engine.create_context()
    parts = [spec.make_inputs(rows, 50 + rows)[0] for rows in (1, 3, 2)]
    parts[1] = np.frombuffer(parts[1].tobytes(), dtype=np.float32).reshape(parts[1].shape)  # read-only
    joined = np.concatenate(parts + [np.zeros((2, 3, 64, 64), np.float32)])
    want = context.run({"input": joined})["output"]
    got = context.run_concatenated({"input": parts}, zero_rows=2)["output"]
    assert got.shape == (8, 1000)
    np.testing.assert_array_equal(got, want)  # the same engine, the same bytes in
    big = spec.make_inputs(8, 9)[0]
    np.testing.assert_array_equal(context.run_concatenated({"input": [big[2:5], big[5:]]}, 2)["output"],
                                  context.run({"input": np.concatenate([big[2:], np.zeros_like(big[:2])])})["output"])
    with pytest.raises(kiln.Error, match="does not continue pieces of shape 1x3x64x64"):
        context.run_concatenated({"input": [parts[0], np.zeros((1, 3, 32, 64), np.float32)]})
    with pytest.raises(kiln.Error, match="dtype float64, the engine expects float32"):
        context.run_concatenated({"input": [parts[0], parts[1].astype(np.float64)]})
    with pytest.raises(kiln.Error, match="zero_rows is -1, not between 0 and"):
        context.run_concatenated({"input": parts}, zero_rows=-1)
    with pytest.raises(kiln.Error, match="fit no optimization profile|above"):
        context.run_concatenated({"input": parts}, zero_rows=3)
    with pytest.raises(kiln.Error, match="'input' is missing"):
        context.run_concatenated({"input": []})
    np.testing.assert_array_equal(context.run_concatenated({"input": parts}, zero_rows=2)["output"], want)


def test_pinned_host_memory_goes_to_the_device_directly(resnet18_64):
    """Pieces lying in kiln.PinnedHostMemory (a server's shared-memory regions) are copied to the
    device from where they lie, between pieces that go through the transfer buffer: the outputs
    equal run() of the pieces joined, a run of one pinned array that of its copy; what the memory
    holds at each run is what runs (nothing kept from the run before); an unaligned piece and an
    mmap work alike; the pin holds while arrays over it live."""
    import mmap

    path, spec = resnet18_64
    engine = kiln.Builder(precision="fp16", device="cuda",
                          profiles=[{"input": ([1, 3, 64, 64], [8, 3, 64, 64], [8, 3, 64, 64])}]).build(path)
    context = engine.create_context()
    image_bytes = 3 * 64 * 64 * 4
    region = mmap.mmap(-1, 6 * image_bytes + 4)
    pinned = kiln.PinnedHostMemory(region)
    assert len(pinned) == len(region) and pinned.address != 0
    memory = np.frombuffer(pinned, dtype=np.uint8)
    first = np.frombuffer(pinned, dtype=np.float32, count=3 * 3 * 64 * 64).reshape(3, 3, 64, 64)
    # (4 bytes in: a piece that starts off any 16-byte boundary.)
    second = np.frombuffer(pinned, dtype=np.float32, count=2 * 3 * 64 * 64, offset=3 * image_bytes + 4).reshape(2, 3, 64, 64)
    unpinned = spec.make_inputs(1, 70)[0]
    for seed in (1, 2):
        first[:] = spec.make_inputs(3, 10 * seed)[0]
        second[:] = spec.make_inputs(2, 10 * seed + 1)[0]
        pieces = [first, unpinned, second]
        want = context.run({"input": np.concatenate(pieces + [np.zeros((2, 3, 64, 64), np.float32)])})["output"]
        got = context.run_concatenated({"input": pieces}, zero_rows=2)["output"]
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(context.run({"input": first})["output"],
                                      context.run({"input": first.copy()})["output"])  # the same plan
    del pinned, region  # the arrays keep the pin and the mapping
    np.testing.assert_array_equal(context.run_concatenated({"input": [second]})["output"],
                                  context.run({"input": second.copy()})["output"])
    assert memory.size == 6 * image_bytes + 4
    with pytest.raises(BufferError):
        kiln.PinnedHostMemory(bytes(64))  # read-only
    with pytest.raises(kiln.Error, match="contiguous"):
        kiln.PinnedHostMemory(np.zeros((4, 4), np.float32)[:, ::2])


class _DlpackOnly:
    """Memory seen only through the DLPack protocol (what CuPy and JAX arrays offer), not as a
    torch tensor: bind() must take any producer."""

    def __init__(self, tensor):
        self._tensor = tensor

    def __dlpack__(self, stream=None):
        return self._tensor.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._tensor.__dlpack_device__()


def test_bound_memory_is_read_and_written_in_place(resnet18_64):
    """Context.bind: runs read the caller's input and write the caller's output tensors (no
    context buffer in between), on a stream of the caller's; buffers used in turn, and more sets of
    addresses than a shape keeps graphs for, each get their own run's results; run() leaves bound
    memory alone; unbind() returns to the context's buffers."""
    import torch

    path, spec = resnet18_64
    cpu = kiln.Engine.from_onnx(path)
    engine = kiln.Builder(precision="fp16", device="cuda",
                          profiles=[{"input": ([1, 3, 64, 64], [4, 3, 64, 64], [8, 3, 64, 64])}]).build(path)
    context = engine.create_context()
    stream = torch.cuda.Stream()
    xs = [spec.make_inputs(4, 100 + i)[0] for i in range(7)]
    wants = [cpu.run({"input": x})["output"] for x in xs]
    inputs = [torch.from_numpy(x).cuda() for x in xs]
    outputs = [torch.full((4, 1000), float("nan"), device="cuda") for _ in xs]
    torch.cuda.synchronize()
    own = torch.from_dlpack(context.output_dlpack(engine, "output"))

    def rounds(pairs: list[int], count: int) -> None:
        # Each pair's run must write its own output and no other pair's.
        for _ in range(count):
            for i in pairs:
                context.bind("input", _DlpackOnly(inputs[i]) if i == 3 else inputs[i])
                context.bind("output", outputs[i])
                assert context.tensor_address("output") == outputs[i].data_ptr()
                assert context.tensor_address("input") == inputs[i].data_ptr()
                with torch.cuda.stream(stream):
                    context.enqueue(stream.cuda_stream)
            stream.synchronize()
            for i in pairs:
                assert rel_l2(outputs[i].cpu().numpy(), wants[i]) < 1e-2, i
                outputs[i].fill_(float("nan"))
            torch.cuda.synchronize()

    def runs_in_place(i: int) -> bool:
        # A pair with a graph of its own writes the caller's output alone: the context's buffer
        # keeps what was put there (a copied run writes it, then copies out).
        own.fill_(float("nan"))
        context.bind("input", inputs[i])
        context.bind("output", outputs[i])
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            context.enqueue(stream.cuda_stream)
        stream.synchronize()
        assert rel_l2(outputs[i].cpu().numpy(), wants[i]) < 1e-2
        return bool(own.isnan().all())

    # 7 sets of addresses at one shape, in turn: the first round meets each for the first time
    # (copies around the graph of the context's buffers); later rounds capture graphs for the
    # first sets met again while graph slots are free (4 per shape, one of them the context's
    # buffers'); the rest keep copying rather than evicting a graph used a few runs ago, which
    # would capture on every run.
    rounds(list(range(7)), 3)
    assert runs_in_place(0)
    assert not runs_in_place(6)
    # A smaller group used alone for a while takes the graphs the others no longer use: they are
    # updated in place for its addresses.
    rounds([4, 5, 6], 3)
    assert runs_in_place(6)

    # run() goes through the context's buffers: the bound output keeps what it has.
    context.bind("input", inputs[0])
    context.bind("output", outputs[0])
    context.enqueue(0)  # the legacy default stream: replayed on the context's own, joined to it
    torch.cuda.synchronize()
    kept = outputs[0].clone()
    got = context.run({"input": xs[1]})["output"]
    assert rel_l2(got, wants[1]) < 1e-2
    torch.testing.assert_close(outputs[0], kept, rtol=0, atol=0)
    assert rel_l2(kept.cpu().numpy(), wants[0]) < 1e-2

    # An input takes the bound tensor's shape (within the profile); a larger output serves a smaller batch.
    small = spec.make_inputs(2, 7)[0]
    big_out = torch.zeros(8, 1000, device="cuda")
    context.bind("input", torch.from_numpy(small).cuda())
    context.bind("output", big_out)
    assert context.input_shape("input") == [2, 3, 64, 64]
    context.enqueue(0)
    torch.cuda.synchronize()
    assert rel_l2(big_out[:2].cpu().numpy(), cpu.run({"input": small})["output"]) < 1e-2
    assert float(big_out[2:].abs().max()) == 0.0  # nothing written past the batch

    # Unbound: the context's own buffers again.
    context.unbind("input")
    context.unbind("output")
    assert context.tensor_address("output") == context.output_pointer("output")
    assert context.tensor_address("input") == context.input_pointer("input")


def _capsule_name(capsule) -> str:
    import ctypes

    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    return get_name(capsule).decode()


def test_device_tensors_export_dlpack_in_place_ordered_after_the_run(resnet18_64):
    """Context.input_tensor/output_tensor: the context's buffers as DLPack producers on the
    engine's GPU. torch and CuPy read them in place; a consumer on a stream other than the run's
    waits for the run (__dlpack__'s stream); DLPack 1.0 capsules when asked for; copy=True and
    another device are refused with BufferError."""
    import cupy
    import torch

    path, spec = resnet18_64
    cpu = kiln.Engine.from_onnx(path)
    engine = kiln.Builder(precision="fp16", device="cuda", shapes={"input": [4, 3, 64, 64]}).build(path)
    context = engine.create_context()
    x = spec.make_inputs(4, 21)[0]
    want = cpu.run({"input": x})["output"]

    # Written in place through the input's DeviceTensor, then run.
    source = context.input_tensor("input")
    assert source.__dlpack_device__() == (2, engine.gpu)
    assert source.shape == (4, 3, 64, 64) and source.data_ptr == context.input_pointer("input")
    torch.from_dlpack(source).copy_(torch.from_numpy(x))
    out = context.output_tensor("output")
    assert out.shape == (4, 1000) and out.dtype == "float32" and out.__dlpack_device__() == (2, engine.gpu)
    view = torch.from_dlpack(out)
    assert view.data_ptr() == context.output_pointer("output") and view.device == torch.device("cuda", engine.gpu)
    view.fill_(float("nan"))
    run_stream, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    # The run waits behind a long kernel on its stream: a consumer that did not wait for it
    # would read the NaNs still there.
    with torch.cuda.stream(run_stream):
        torch.cuda._sleep(200_000_000)
        context.enqueue(run_stream.cuda_stream)
    with torch.cuda.stream(consumer):
        got = torch.from_dlpack(context.output_tensor("output")).clone()
    consumer.synchronize()
    assert rel_l2(got.cpu().numpy(), want) < 1e-2
    with torch.cuda.stream(run_stream):
        torch.cuda._sleep(200_000_000)
        view.fill_(float("nan"))
        torch.cuda._sleep(200_000_000)
        context.enqueue(run_stream.cuda_stream)
    with cupy.cuda.Stream(non_blocking=True) as cupy_stream:
        in_place = cupy.from_dlpack(context.output_tensor("output"))
        through_cupy = in_place.copy()
        cupy_stream.synchronize()
    assert in_place.data.ptr == context.output_pointer("output")
    assert rel_l2(cupy.asnumpy(through_cupy), want) < 1e-2
    torch.cuda.synchronize()

    assert _capsule_name(out.__dlpack__(stream=-1)) == "dltensor"
    versioned = out.__dlpack__(stream=-1, max_version=(1, 0))
    assert _capsule_name(versioned) == "dltensor_versioned"
    with pytest.raises(BufferError, match="copy=True"):
        out.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="not on DLPack device"):
        out.__dlpack__(dl_device=(1, 0))
    with pytest.raises(kiln.InvalidArgumentError, match="no output 'logits'"):
        context.output_tensor("logits")
    del context, source, out, versioned, in_place
    gc.collect()
    assert rel_l2(view.cpu().numpy(), want) < 1e-2  # the view keeps the context's memory alive


def test_bind_refuses_memory_it_cannot_use_and_the_context_runs_on(resnet18_64):
    import torch

    path, spec = resnet18_64
    engine = kiln.Builder(precision="fp16", device="cuda", shapes={"input": [4, 3, 64, 64]}).build(path)
    context = engine.create_context()
    x = torch.from_numpy(spec.make_inputs(4, 3)[0]).cuda()
    with pytest.raises(kiln.Error, match="not aligned to 256 bytes"):
        context.bind("input", torch.zeros(4 * 3 * 64 * 64 + 1, device="cuda")[1:].view(4, 3, 64, 64))
    with pytest.raises(kiln.Error, match="not dense and row-major"):
        context.bind("input", torch.zeros(4, 3, 64, 64, device="cuda").transpose(2, 3))
    with pytest.raises(kiln.Error, match="the engine's is float32"):
        context.bind("input", x.half())
    with pytest.raises(kiln.Error, match="not on a CUDA device"):
        context.bind("input", x.cpu())
    with pytest.raises(kiln.Error, match="has no __dlpack__"):
        context.bind("input", [1.0, 2.0])
    with pytest.raises(kiln.Error, match="no input or output named 'image'"):
        context.bind("image", x)
    with pytest.raises(kiln.Error, match="outside optimization profile|not the engine's|above"):
        context.bind("input", torch.zeros(8, 3, 64, 64, device="cuda"))
    # Raw pointers: host memory, and a size past the allocation, are refused.
    pinned = torch.zeros(4, 3, 64, 64).pin_memory()
    with pytest.raises(kiln.Error, match="not device memory"):
        context.set_tensor_address("input", pinned.data_ptr(), pinned.numel() * 4)
    with pytest.raises(kiln.Error, match="past the end of its allocation"):
        context.set_tensor_address("input", x.data_ptr(), 1 << 40)
    # An output too small for the shape is refused when the run is enqueued.
    context.bind("input", x)
    context.bind("output", torch.zeros(2, 1000, device="cuda"))
    with pytest.raises(kiln.Error, match="output 'output' is bound to 8000 bytes; at shape 4x1000 float32 it takes 16000"):
        context.enqueue(0)
    out = torch.empty(4, 1000, device="cuda")
    context.bind("output", out)
    context.enqueue(0)
    torch.cuda.synchronize()
    want = kiln.Engine.from_onnx(path).run({"input": x.cpu().numpy()})["output"]
    assert rel_l2(out.cpu().numpy(), want) < 1e-2
    # run_torch reads its inputs in place and writes the outputs it is given.
    given = torch.empty(4, 1000, device="cuda")
    got = context.run_torch({"input": x}, outputs={"output": given})["output"]
    torch.cuda.synchronize()
    assert got.data_ptr() == given.data_ptr() and rel_l2(given.cpu().numpy(), want) < 1e-2


def test_torch_compile_backend_writes_fresh_outputs_every_call():
    """The backend binds the caller's inputs and new output tensors per call: outputs kept across
    calls (each at a new address: copied out of the context's buffers) and outputs dropped
    (addresses reused in turn: graphs of their own) all hold their own call's results."""
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval().cuda()
    fast = torch.compile(model, backend="kiln", dynamic=False)  # a graph per strides too, none symbolic
    xs = [torch.randn(2, 3, 64, 64, device="cuda") for _ in range(10)]
    with torch.no_grad():
        kept = [fast(x) for x in xs]
        wants = [model(x) for x in xs]
        for x, want in zip(xs, wants):  # results dropped at once
            assert rel_l2(fast(x).cpu().numpy(), want.cpu().numpy()) < 1e-2
        strided = torch.randn(2, 64, 64, 3, device="cuda").permute(0, 3, 1, 2)  # not row-major: copied in
        assert rel_l2(fast(strided).cpu().numpy(), model(strided).cpu().numpy()) < 1e-2
    assert len({t.data_ptr() for t in kept}) == len(kept)
    for got, want in zip(kept, wants):
        assert rel_l2(got.cpu().numpy(), want.cpu().numpy()) < 1e-2
