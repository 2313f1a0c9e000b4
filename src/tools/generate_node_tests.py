"""Writes the ONNX backend node test cases of the installed onnx package, in the layout
`kiln conformance` reads (DIR/node/<case>/model.onnx, test_data_set_N/input_M.pb, output_M.pb).

Debian's libonnx-testdata holds the cases of onnx 1.12; this gives the newer ones (newer ops
and opsets) of whatever onnx the virtual environment has:

    .venv/bin/python src/tools/generate_node_tests.py -o /tmp/onnx-node-tests
    build/kiln conformance /tmp/onnx-node-tests

(`python -m onnx.backend.test.cmd_tools generate-data -o DIR` in onnx >= 1.16 writes only the
"simple" and "real" model cases, not the node cases.)
"""
import argparse
import os
import shutil

from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", required=True, help="output directory (node/ is created inside)")
    parser.add_argument("--op-type", default=None, help="only the cases of this operator")
    args = parser.parse_args()

    written = skipped = 0
    for case in collect_testcases(args.op_type):
        case_dir = os.path.join(args.output, "node", case.name)
        shutil.rmtree(case_dir, ignore_errors=True)
        os.makedirs(case_dir)
        with open(os.path.join(case_dir, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for i, (inputs, outputs) in enumerate(case.data_sets):
            set_dir = os.path.join(case_dir, f"test_data_set_{i}")
            os.makedirs(set_dir)
            try:
                for kind, values, infos in (("input", inputs, case.model.graph.input),
                                            ("output", outputs, case.model.graph.output)):
                    for j, value in enumerate(values):
                        info = infos[j]
                        if info.type.HasField("sequence_type"):
                            proto = numpy_helper.from_list(value, info.name)
                        elif info.type.HasField("optional_type"):
                            proto = numpy_helper.from_optional(value, info.name)
                        elif hasattr(value, "SerializeToString"):
                            proto = value
                        else:
                            proto = numpy_helper.from_array(value, info.name)
                        with open(os.path.join(set_dir, f"{kind}_{j}.pb"), "wb") as f:
                            f.write(proto.SerializeToString())
            except Exception as e:  # a value numpy_helper cannot write (e.g. a map): drop the case
                print(f"skipped {case.name}: {e}")
                shutil.rmtree(case_dir, ignore_errors=True)
                skipped += 1
                break
        else:
            written += 1
    print(f"wrote {written} node test cases to {os.path.join(args.output, 'node')} ({skipped} skipped)")


if __name__ == "__main__":
    main()
