"""`kiln debug reduce`: shrink a model that fails into a small subgraph that still fails, written
as ONNX (as Polygraphy's `debug reduce` does), to report or to debug.

    kiln debug reduce model.onnx -o reduced.onnx                      # kiln's CPU engine against ONNX Runtime
    kiln debug reduce model.onnx -o reduced.onnx --device cuda --fp16  # any `kiln run` engine flag is passed on
    kiln debug reduce model.onnx -o reduced.onnx --fail-regex Resize  # only failures whose message matches
    kiln debug reduce model.onnx -o reduced.onnx --check ./my_check.sh {model}

A subgraph fails, by default, as `kiln check` fails: kiln refuses it or errs where ONNX Runtime
runs it, or an output misses |kiln - ref| <= atol + rtol * |ref| (defaults by precision, as
kiln check's). A subgraph ONNX Runtime cannot run does not fail. `--check COMMAND...` (the rest
of the command line) decides instead: the subgraph's path replaces {model} (or is the last
argument) and a non-zero exit status fails. `--fail-regex` counts a failure only when the
message (kiln's error and the outputs that miss; the command's output) matches.

The values flowing through the model come from ONNX Runtime, run once on the model with seeded
random inputs (or --inputs): a tensor that becomes an input of a subgraph is fed its value there,
so every subgraph sees what it sees inside the model. The search: bisect from the outputs' side
(the first node whose outputs fail), bisect from the inputs' side (the last start that still
fails), then try an earlier node's outputs as the outputs and removing each remaining node
(unless --no-linear). Subgraphs keep only the nodes their outputs need. The result is written
with the values of its inputs (FILE.inputs/*.npy) and the `kiln check` command that reproduces
the failure; exit status 0 when a failing subgraph was written, 1 when the model does not fail
or on an error.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

import numpy as np

from kiln import check
from kiln._usage import UsageParser


def log(message: str) -> None:
    print(f"kiln debug reduce: {message}", flush=True)


def _names_used(node) -> list[str]:
    """The values a node reads: its inputs and the outer-scope names its subgraphs read."""
    used = [name for name in node.input if name]
    for attribute in node.attribute:
        for graph in [attribute.g] * attribute.HasField("g") + list(attribute.graphs):
            inner = {i.name for i in graph.input} | {t.name for t in graph.initializer}
            inner |= {o for n in graph.node for o in n.output}
            used += [name for n in graph.node for name in _names_used(n) if name not in inner]
    return used


class Reducer:
    """Builds subgraphs of `model` (node index sets plus chosen outputs) and asks whether they fail."""

    def __init__(self, model, values: dict[str, np.ndarray], fails, work: str):
        self.model, self.values, self.fails, self.work = model, values, fails, work
        self.nodes = list(model.graph.node)
        self.initializers = {t.name: t for t in model.graph.initializer}
        self.producer = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        self.checks = 0

    def outputs_of(self, index: int) -> list[str]:
        return [o for o in self.nodes[index].output if o and o in self.values]

    def needed(self, keep: set[int], outputs: list[str]) -> set[int]:
        """The nodes of `keep` that `outputs` depend on through nodes of `keep`."""
        needed, todo = set(), [self.producer[o] for o in outputs if self.producer.get(o) in keep]
        while todo:
            i = todo.pop()
            if i in needed:
                continue
            needed.add(i)
            todo += [self.producer[n] for n in _names_used(self.nodes[i]) if self.producer.get(n) in keep]
        return needed

    def subgraph(self, keep: set[int], outputs: list[str]):
        """(model, feed) of the nodes `keep` needs for `outputs`, or None when an input has no value."""
        from onnx import helper

        keep = self.needed(keep, outputs)
        nodes = [self.nodes[i] for i in sorted(keep)]
        produced = {o for n in nodes for o in n.output if o}
        inputs, initializers = [], []
        for name in (name for n in nodes for name in _names_used(n)):
            if name in produced or name in inputs or any(t.name == name for t in initializers):
                continue
            if name in self.initializers:
                initializers.append(self.initializers[name])
            elif name in self.values:
                inputs.append(name)
            else:
                return None
        for name in outputs:
            if name not in self.values:
                return None

        def info(name: str):
            v = self.values[name]
            return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))

        graph = helper.make_graph(nodes, f"{self.model.graph.name or 'model'}_reduced", [info(n) for n in inputs],
                                  [info(n) for n in outputs], initializers)
        reduced = helper.make_model(graph, opset_imports=list(self.model.opset_import), ir_version=self.model.ir_version,
                                    producer_name="kiln debug reduce")
        reduced.functions.extend(self.model.functions)
        return reduced, {n: self.values[n] for n in inputs}

    def check(self, keep: set[int], outputs: list[str]) -> bool:
        built = self.subgraph(keep, outputs)
        if built is None:
            return False
        self.checks += 1
        failed, _ = self.fails(built[0], built[1], os.path.join(self.work, f"candidate{self.checks}"))
        return failed

    def reduce(self, linear: bool) -> tuple[set[int], list[str]]:
        count = len(self.nodes)
        graph_outputs = [o.name for o in self.model.graph.output]
        everything = set(range(count))
        # Outputs' side: the first node whose outputs, computed by the nodes before it, fail.
        ends = sorted({self.producer[o] for o in graph_outputs if o in self.producer})
        hi = next((e for e in ends if self.check(set(range(e + 1)), self.outputs_of(e))), None)
        if hi is None:
            log("no graph output's producer fails alone: reducing from the inputs' side only")
            keep, outputs = everything, graph_outputs
        else:
            lo = 0
            while lo < hi:
                mid = (lo + hi) // 2
                failed = self.check(set(range(mid + 1)), self.outputs_of(mid))
                log(f"outputs' side: nodes 0-{mid}: {'fails' if failed else 'passes'}")
                hi, lo = (mid, lo) if failed else (hi, mid + 1)
            keep, outputs = set(range(hi + 1)), self.outputs_of(hi)
        # Inputs' side: the last first node from which the subgraph still fails.
        end = max(keep)
        lo, hi = 0, end
        while lo < hi:
            mid = (lo + hi + 1) // 2
            failed = self.check(set(range(mid, end + 1)) & keep, outputs)
            log(f"inputs' side: nodes {mid}-{end}: {'fails' if failed else 'passes'}")
            lo, hi = (mid, hi) if failed else (lo, mid - 1)
        keep = self.needed(set(range(lo, end + 1)) & keep, outputs)
        if linear:
            # An earlier node's outputs as the subgraph's outputs (failure need not grow with the
            # prefix: a branch may fail where the nodes after it join the failing path).
            for i in sorted(keep):
                trial_outputs = self.outputs_of(i)
                if not trial_outputs or trial_outputs == outputs:
                    continue
                trial = self.needed(keep, trial_outputs)
                if self.check(trial, trial_outputs):
                    keep, outputs = trial, trial_outputs
                    log(f"the outputs of node '{self.nodes[i].name}' ({self.nodes[i].op_type}): fails; {len(keep)} nodes left")
                    break
            # Each remaining node: its outputs become inputs fed with their values, if it still fails.
            for i in sorted(keep, reverse=True):
                if any(o in outputs for o in self.nodes[i].output) or i not in keep:
                    continue
                trial = self.needed(keep - {i}, outputs)
                if trial and self.check(trial, outputs):
                    keep = trial
                    log(f"without node '{self.nodes[i].name}' ({self.nodes[i].op_type}): fails; {len(keep)} nodes left")
        return keep, outputs


def builtin_check(kiln: str, engine_flags: list[str], atol: float, rtol: float, fail_regex):
    """The default failure: kiln errs where ONNX Runtime runs, or an output misses the tolerance."""
    import onnx
    import onnxruntime as ort

    def fails(model, feed: dict, work: str) -> tuple[bool, str]:
        os.makedirs(work, exist_ok=True)
        path = os.path.join(work, "model.onnx")
        onnx.save(model, path)
        try:
            session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            want = dict(zip(names, session.run(names, feed)))
        except Exception:  # noqa: BLE001 (ONNX Runtime cannot run it: not kiln's failure)
            return False, ""
        try:
            got = check.run_kiln(kiln, path, feed, engine_flags, os.path.join(work, "out"), mark_all=False)
        except check.KilnRunFailed as e:
            message = e.stderr.strip()
        else:
            missing = [check.describe(name, r) for name in want
                       if not (r := check.compare(got[check.file_key(name)], want[name], atol, rtol)
                               if check.file_key(name) in got else {"ok": False, "why": "missing from kiln"})["ok"]]
            message = "; ".join(missing)
        failed = bool(message) and (fail_regex is None or fail_regex.search(message) is not None)
        return failed, message

    return fails


def command_check(command: list[str], fail_regex):
    """--check: the command's exit status decides, the subgraph's path in place of {model}."""
    import onnx

    def fails(model, feed: dict, work: str) -> tuple[bool, str]:
        os.makedirs(work, exist_ok=True)
        path = os.path.join(work, "model.onnx")
        onnx.save(model, path)
        args = [a.replace("{model}", path) for a in command]
        if args == command:
            args.append(path)
        r = subprocess.run(args, capture_output=True, text=True)
        message = r.stdout + r.stderr
        failed = r.returncode != 0 and (fail_regex is None or fail_regex.search(message) is not None)
        return failed, message

    return fails


def reduce_main(argv: list[str]) -> int:
    p = UsageParser(prog="kiln debug reduce", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the ONNX model that fails")
    p.add_argument("-o", "--output", required=True, help="the reduced model to write (.onnx)")
    p.add_argument("--inputs", action="append", default=[], metavar="NAME=FILE.npy", help="input data (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="of the random inputs when --inputs is not given")
    p.add_argument("--batch", type=int, help="the first dimension of inputs whose first dimension is dynamic")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE", help="a dynamic dimension's value")
    p.add_argument("--atol", type=float, help="absolute tolerance (default: by precision, as kiln check)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default: by precision, as kiln check)")
    p.add_argument("--fail-regex", help="count a failure only when its message matches this regular expression")
    p.add_argument("--no-linear", action="store_true", help="bisect only; do not try removing each remaining node")
    p.add_argument("--kiln-bin", help="the kiln executable (default: $KILN_BIN, kiln on the PATH)")
    p.add_argument("--check", nargs=argparse.REMAINDER, metavar="COMMAND", help="decide failure by this command's exit status")
    args, engine_flags = p.parse_known_args(argv)
    if unknown := check.unknown_engine_flag(engine_flags):
        p.error(f"unknown option {unknown} (kiln debug reduce's own options and kiln run's engine flags are accepted)")
    if args.check is not None and not args.check:
        p.error("--check needs a command")
    if not args.output.endswith(".onnx"):
        p.error(f"-o {args.output}: the reduced model is written as ONNX: name it .onnx")
    try:
        fail_regex = re.compile(args.fail_regex) if args.fail_regex else None
    except re.error as e:
        p.error(f"--fail-regex {args.fail_regex}: {e}")
    for d in args.dim:
        engine_flags += ["--dim", d]

    import onnx

    if not os.path.isfile(args.model):
        sys.exit(f"kiln: error: kiln debug reduce: {args.model}: no such file")
    model = onnx.load(args.model)
    args.random = 1
    feed = check.make_inputs(model, args)[0]
    tol = check.default_tolerance(engine_flags)
    atol = args.atol if args.atol is not None else tol
    rtol = args.rtol if args.rtol is not None else tol
    if args.check is not None:
        fails = command_check(args.check, fail_regex)
        log(f"{args.model}: {len(model.graph.node)} nodes; failing means: {shlex.join(args.check)} exits non-zero")
    else:
        from kiln.compare import find_kiln

        fails = builtin_check(find_kiln(args.kiln_bin), engine_flags, atol, rtol, fail_regex)
        log(f"{args.model}: {len(model.graph.node)} nodes; failing means: kiln {' '.join(engine_flags) or '(CPU engine)'} "
            f"errs or misses atol {atol:g}, rtol {rtol:g} against ONNX Runtime")
    log("the values of every tensor, from ONNX Runtime")
    try:
        every = [o for n in model.graph.node for o in n.output if o]
        values = {k: v for k, v in check.run_onnxruntime(model, feed, every).items() if isinstance(v, np.ndarray)}
    except Exception as e:  # noqa: BLE001 (reported as one line)
        sys.exit(f"kiln: error: kiln debug reduce: ONNX Runtime cannot run {args.model} ({e}); the subgraphs' inputs "
                 "take its values")
    values.update(feed)
    with tempfile.TemporaryDirectory(prefix="kiln-reduce-") as work:
        reducer = Reducer(model, values, fails, work)
        failed, message = fails(model, feed, os.path.join(work, "whole"))
        if not failed:
            log(f"{args.model} does not fail: nothing to reduce")
            return 1
        log(f"{args.model} fails: {message.strip().splitlines()[0] if message.strip() else '(no message)'}")
        keep, outputs = reducer.reduce(linear=not args.no_linear)
        reduced, reduced_feed = reducer.subgraph(keep, outputs)
        failed, message = fails(reduced, reduced_feed, os.path.join(work, "final"))
    if not failed:  # the search only keeps failing subgraphs; a flaky check ends here
        sys.exit("kiln: error: kiln debug reduce: the reduced model passes when checked again: the failure is not "
                 "deterministic")
    onnx.save(reduced, args.output)
    folder = os.path.splitext(args.output)[0] + ".inputs"
    os.makedirs(folder, exist_ok=True)
    reproduce = ["kiln", "check", args.output]
    for i, (name, value) in enumerate(reduced_feed.items()):
        path = os.path.join(folder, f"input_{i}.npy")
        np.save(path, value)
        reproduce += ["--inputs", f"{name}={path}"]
    nodes = [n for i, n in enumerate(model.graph.node) if i in keep]
    described = ", ".join(f"'{n.name}' ({n.op_type})" for n in nodes[:8]) + (", ..." if len(nodes) > 8 else "")
    log(f"reduced {len(model.graph.node)} nodes to {len(nodes)} in {reducer.checks} checks: {described}")
    log(f"it fails: {message.strip().splitlines()[0] if message.strip() else '(no message)'}")
    log(f"wrote {args.output} and its inputs' values in {folder}/")
    if args.check is None:
        log(f"reproduce: {shlex.join(reproduce + engine_flags + ['--atol', f'{atol:g}', '--rtol', f'{rtol:g}'])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = ("usage: kiln debug reduce MODEL -o REDUCED.onnx [options] (kiln debug reduce --help)\n"
             "       kiln debug precision MODEL --calib DATA [options] (kiln debug precision --help)")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage + "\n\nreduce: shrink a failing model to a small subgraph that still fails, written as ONNX"
              "\nprecision: the fewest layers of an INT8 or FP8 model to keep in float for a tolerance, and every "
              "layer's sensitivity")
        return 0 if argv else 1
    if argv[0] == "precision":
        from kiln import debug_precision

        return debug_precision.main(argv[1:])
    if argv[0] != "reduce":
        sys.stderr.write(f"kiln: error: kiln debug: no subcommand '{argv[0]}' (there are: reduce, precision)\n{usage}\n")
        return 1
    return reduce_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
