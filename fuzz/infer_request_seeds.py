"""Writes the seed corpus of fuzz/fuzz_infer_request.cc into fuzz/seeds/: ModelInferRequests (the
Open Inference Protocol's gRPC message, in protobuf's wire format) for its model (x: FP32 [-1, 4],
ids: INT64 [-1, 2]; outputs y and n) and its region "r0" (1,024 bytes): raw contents, typed
contents, inputs in the region, an output into it, and outputs asked for by name.

    .venv-serve/bin/python fuzz/infer_request_seeds.py
"""
import os

import numpy as np
from tritonclient.grpc import service_pb2 as pb

SEEDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds")


def request(rows: int) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="m", id="seed")
    r.inputs.add(name="x", datatype="FP32", shape=[rows, 4])
    r.inputs.add(name="ids", datatype="INT64", shape=[rows, 2])
    return r


def raw(rows: int) -> pb.ModelInferRequest:
    r = request(rows)
    r.raw_input_contents.append(np.arange(rows * 4, dtype=np.float32).tobytes())
    r.raw_input_contents.append(np.arange(rows * 2, dtype=np.int64).tobytes())
    return r


def typed() -> pb.ModelInferRequest:
    r = request(2)
    r.inputs[0].contents.fp32_contents.extend([0.5] * 8)
    r.inputs[1].contents.int64_contents.extend([1, 2, 3, 4])
    return r


def in_region() -> pb.ModelInferRequest:
    r = request(3)
    for i, (inp, nbytes) in enumerate(zip(r.inputs, (3 * 4 * 4, 3 * 2 * 8))):
        inp.parameters["shared_memory_region"].string_param = "r0"
        inp.parameters["shared_memory_byte_size"].int64_param = nbytes
        inp.parameters["shared_memory_offset"].uint64_param = 256 * i
    out = r.outputs.add(name="y")
    out.parameters["shared_memory_region"].string_param = "r0"
    out.parameters["shared_memory_byte_size"].int64_param = 3 * 3 * 4
    out.parameters["shared_memory_offset"].int64_param = 512
    return r


def outputs_by_name() -> pb.ModelInferRequest:
    r = raw(1)
    r.outputs.add(name="n")
    return r


def main() -> None:
    seeds = {"infer_raw_2_rows.pb": raw(2), "infer_raw_8_rows.pb": raw(8), "infer_typed.pb": typed(),
             "infer_region.pb": in_region(), "infer_output_by_name.pb": outputs_by_name()}
    for name, message in seeds.items():
        with open(os.path.join(SEEDS, name), "wb") as f:
            f.write(message.SerializeToString())
        print(name)


if __name__ == "__main__":
    main()
