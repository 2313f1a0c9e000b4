"""`kiln report results.json -o DIR`: charts (PNG and SVG) and one self-contained HTML page from a
`kiln compare` results file (docs/results-schema.md).

    kiln report out/results.json -o out/report [--title "ResNet-50 on an H200"]

Charts: latency by batch and variant, throughput against batch size, speed-up over PyTorch,
accuracy against speed-up, and memory and engine size. kiln's variants are drawn in NVIDIA green
(#76B900 and its shades), PyTorch's in greys and blues. The HTML page embeds the SVG charts and
holds the tables (configurations that could not run are listed with their reason), so it can
be mailed or archived as one file. Needs matplotlib (and numpy).
"""
from __future__ import annotations

import argparse
import html
import json
import os
import sys

SCHEMA_MAJOR = "kiln.compare/1"
KILN_GREENS = {"fp32": "#4A7A00", "fp16": "#76B900", "int8": "#A8D95B"}
TORCH_COLORS = {"eager-fp32": "#5F6B7A", "eager-fp16": "#9AA5B1", "compile": "#2F6FB3"}
GREEN = "#76B900"


def load_results(path: str) -> dict:
    """Reads and checks a results file; ValueError names the file and what is wrong."""
    try:
        with open(path) as f:
            results = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(results, dict):
        raise ValueError(f"{path}: not a kiln compare results file (the top level is not an object)")
    schema = str(results.get("schema", ""))
    if not (schema == SCHEMA_MAJOR or schema.startswith(SCHEMA_MAJOR + ".")):
        raise ValueError(f"{path}: schema {schema or '(none)'!r}; kiln report reads {SCHEMA_MAJOR!r} "
                         "(files written by kiln compare)")
    for key in ("model", "device", "results"):
        if key not in results:
            raise ValueError(f"{path}: the key {key!r} is missing")
    return results


def label(entry: dict) -> str:
    return f"{entry['runtime']} {entry['variant']}"


def color(runtime: str, variant: str) -> str:
    return (KILN_GREENS if runtime == "kiln" else TORCH_COLORS).get(variant, GREEN if runtime == "kiln" else "#7F7F7F")


def measured(results: dict) -> list[dict]:
    return [r for r in results["results"] if "latency_ms" in r and "error" not in r]


def series(results: dict) -> dict[tuple[str, str], dict[int, dict]]:
    """(runtime, variant) -> {batch: entry}, PyTorch first, in the order of the file."""
    out: dict[tuple[str, str], dict[int, dict]] = {}
    for r in sorted(measured(results), key=lambda r: r["runtime"] != "pytorch"):
        out.setdefault((r["runtime"], r["variant"]), {})[r["batch"]] = r
    return out


def speedups(results: dict) -> dict[tuple[str, int], float]:
    """(kiln variant, batch) -> PyTorch eager fp32's median latency / kiln's."""
    s = series(results)
    base = s.get(("pytorch", "eager-fp32"), {})
    out = {}
    for (runtime, variant), by_batch in s.items():
        if runtime != "kiln":
            continue
        for b, e in by_batch.items():
            if b in base:
                out[(variant, b)] = base[b]["latency_ms"]["median"] / e["latency_ms"]["median"]
    return out


# --- charts ---------------------------------------------------------------------------------
def _figure(title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    ax.set_title(title, fontsize=12, loc="left")
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", color="#E5E5E5")
    ax.set_axisbelow(True)
    return plt, fig, ax


def chart_latency(results: dict):
    s = series(results)
    batches = sorted({b for by in s.values() for b in by})
    if not s:
        return None
    import numpy as np

    plt, fig, ax = _figure("Latency by batch size (median, lower is better)")
    width = 0.8 / len(s)
    for i, ((runtime, variant), by) in enumerate(s.items()):
        xs = [j + i * width for j, b in enumerate(batches) if b in by]
        ys = [by[b]["latency_ms"]["median"] for b in batches if b in by]
        ax.bar(xs, ys, width, label=f"{runtime} {variant}", color=color(runtime, variant))
    ax.set_xticks(np.arange(len(batches)) + 0.4 - width / 2, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("latency (ms)")
    if max(e["latency_ms"]["median"] for by in s.values() for e in by.values()) > 20 * min(
            e["latency_ms"]["median"] for by in s.values() for e in by.values()):
        ax.set_yscale("log")
    ax.legend(fontsize=8, frameon=False, ncol=2)
    return fig


def chart_throughput(results: dict):
    s = series(results)
    if not s:
        return None
    plt, fig, ax = _figure("Throughput against batch size (higher is better)")
    for (runtime, variant), by in s.items():
        bs = sorted(by)
        ax.plot(bs, [by[b]["throughput"] for b in bs], marker="o", label=f"{runtime} {variant}",
                color=color(runtime, variant), linewidth=2.5 if runtime == "kiln" else 1.5)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("items per second")
    ax.legend(fontsize=8, frameon=False)
    return fig


def chart_speedup(results: dict):
    sp = speedups(results)
    if not sp:
        return None
    import numpy as np

    variants = sorted({v for v, _ in sp}, key=list(KILN_GREENS).index if all(v in KILN_GREENS for v, _ in sp) else str)
    batches = sorted({b for _, b in sp})
    plt, fig, ax = _figure("kiln's speed-up over PyTorch eager fp32 (higher is better)")
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        xs = [j + i * width for j, b in enumerate(batches) if (v, b) in sp]
        ys = [sp[(v, b)] for b in batches if (v, b) in sp]
        bars = ax.bar(xs, ys, width, label=f"kiln {v}", color=color("kiln", v))
        ax.bar_label(bars, fmt="%.2fx", fontsize=7)
    ax.axhline(1.0, color="#444444", linestyle="--", linewidth=1)
    ax.set_xticks(np.arange(len(batches)) + 0.4 - width / 2, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("speed-up (x)")
    ax.legend(fontsize=8, frameon=False)
    return fig


def chart_accuracy(results: dict):
    entries = (results.get("accuracy") or {}).get("entries") or []
    s = series(results)
    base = s.get(("pytorch", "eager-fp32"), {})
    if not entries or not base:
        return None
    largest = max(base)
    points = []
    for e in entries:
        mine = s.get((e["runtime"], e["variant"]), {})
        if largest in mine and e.get("top1_agreement") is not None:
            points.append((base[largest]["latency_ms"]["median"] / mine[largest]["latency_ms"]["median"],
                           e["top1_agreement"], e))
    if not points:
        return None
    plt, fig, ax = _figure(f"Accuracy against speed-up (batch {largest})")
    points.append((1.0, 1.0, {"runtime": "pytorch", "variant": "eager-fp32"}))
    for x, y, e in points:
        ax.scatter([x], [y], s=80, color=color(e["runtime"], e["variant"]), zorder=3)
        ax.annotate(label(e), (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
    ax.set_xlabel("speed-up over PyTorch eager fp32 (x)")
    ax.set_ylabel("top-1 agreement with PyTorch fp32")
    ax.set_ylim(min(0.9, min(y for _, y, _ in points) - 0.02), 1.01)
    return fig


def chart_memory(results: dict):
    sizes = results.get("sizes") or []
    rows = [(label(s), s) for s in sizes if any(s.get(k) for k in ("engine_bytes", "weight_bytes", "activation_bytes"))]
    if not rows:
        return None
    import numpy as np

    plt, fig, ax = _figure("Memory and engine size (MiB)")
    keys = [("engine_bytes", "engine / parameters", 1.0), ("weight_bytes", "weights on the device", 0.75),
            ("activation_bytes", "activations (one context)", 0.45)]
    keys = [k for k in keys if any(s.get(k[0]) for _, s in rows)]
    width = 0.8 / len(keys)
    for i, (key, name, alpha) in enumerate(keys):
        xs = np.arange(len(rows)) + i * width
        ys = [(s.get(key) or 0) / 2**20 for _, s in rows]
        ax.bar(xs, ys, width, label=name, color=[color(s["runtime"], s["variant"]) for _, s in rows], alpha=alpha,
               edgecolor="#333333", linewidth=0.5)
    ax.set_xticks(np.arange(len(rows)) + 0.4 - width / 2, [n for n, _ in rows], rotation=15, fontsize=8)
    ax.set_ylabel("MiB")
    ax.legend(fontsize=8, frameon=False)
    return fig


CHARTS = [
    ("latency", "Latency by batch size and precision", chart_latency),
    ("throughput", "Throughput against batch size", chart_throughput),
    ("speedup", "Speed-up over PyTorch", chart_speedup),
    ("accuracy", "Accuracy against speed-up", chart_accuracy),
    ("memory", "Memory and engine size", chart_memory),
]


# --- HTML -----------------------------------------------------------------------------------
def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _num(x, fmt: str = "{:.3f}") -> str:
    return "" if x is None else html.escape(fmt.format(x))


def _mib(x) -> str:
    return "" if not x else f"{x / 2**20:.1f}"


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }}
h1 {{ border-bottom: 4px solid #76B900; padding-bottom: .3em; }}
h2 {{ color: #4A7A00; margin-top: 1.6em; }}
table {{ border-collapse: collapse; margin: .5em 0 1em; font-size: 14px; }}
th {{ background: #76B900; color: #fff; text-align: left; }}
th, td {{ padding: 4px 10px; border-bottom: 1px solid #ddd; }}
td.error {{ color: #A33; }}
.chart svg {{ max-width: 100%; height: auto; }}
.missing {{ color: #777; font-style: italic; }}
.meta {{ color: #555; font-size: 14px; }}
</style></head>
<body>
<h1>{title}</h1>
<p class="meta">{meta}</p>
{sections}
<script>
window.onerror = function (message) {{
  document.body.dataset.errors = (document.body.dataset.errors || "") + message + "; ";
}};
window.addEventListener("load", function () {{
  var charts = document.querySelectorAll(".chart svg");
  var rendered = 0;
  charts.forEach(function (svg) {{ if (svg.getBBox().width > 0) rendered += 1; }});
  document.body.dataset.chartsExpected = String(charts.length);
  document.body.dataset.chartsRendered = String(rendered);
}});
</script>
</body></html>
"""


def write_report(results: dict, out_dir: str, title: str | None = None) -> dict:
    """Writes DIR/<chart>.png and .svg for every chart the data allows, and DIR/report.html."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    model, device = results["model"], results["device"]
    title = title or f"kiln and PyTorch: {model.get('name', '?')} on {device.get('name', device.get('kind', '?'))}"
    written, sections = [], []
    for name, heading, draw in CHARTS:
        fig = draw(results)
        if fig is None:
            sections.append(f"<h2>{html.escape(heading)}</h2><p class='missing'>No data for this chart in the results "
                            "file.</p>")
            continue
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"{name}.png"))
        fig.savefig(os.path.join(out_dir, f"{name}.svg"))
        plt.close(fig)
        with open(os.path.join(out_dir, f"{name}.svg")) as f:
            svg = f.read()
        svg = svg[svg.find("<svg"):]  # inline: without the XML declaration and doctype
        sections.append(f"<h2>{html.escape(heading)}</h2><div class='chart' id='chart-{name}'>{svg}</div>")
        written.append(name)

    sp = speedups(results)
    rows = []
    for r in results["results"]:
        if "error" in r or "latency_ms" not in r:
            rows.append([html.escape(r["runtime"]), html.escape(r["variant"]), str(r["batch"]),
                         f"<span class='error'>not measured: {html.escape(str(r.get('error', 'no figures')))}</span>",
                         "", "", "", ""])
            continue
        lat = r["latency_ms"]
        s = sp.get((r["variant"], r["batch"])) if r["runtime"] == "kiln" else None
        rows.append([html.escape(r["runtime"]), html.escape(r["variant"]), str(r["batch"]), _num(lat.get("median")),
                     _num(lat.get("p90")), _num(lat.get("p99")), _num(r.get("throughput"), "{:.1f}"),
                     _num(s, "{:.2f}x")])
    tables = ["<h2>Measurements</h2>", html.escape(results.get("timing", "")),
              _table(["runtime", "variant", "batch", "median ms", "p90 ms", "p99 ms", "items/s",
                      "speed-up over PyTorch eager fp32"], rows)]
    if results.get("sizes"):
        tables += ["<h2>Sizes</h2>", _table(["runtime", "variant", "engine / parameters MiB", "weights MiB",
                                              "activations MiB"],
                                             [[html.escape(s["runtime"]), html.escape(s["variant"]),
                                               _mib(s.get("engine_bytes")), _mib(s.get("weight_bytes")),
                                               _mib(s.get("activation_bytes"))] for s in results["sizes"]])]
    acc = results.get("accuracy") or {}
    if acc.get("entries"):
        tables += ["<h2>Accuracy</h2>",
                   html.escape(f"Against {acc.get('reference', '?')}, on {acc.get('inputs', '?')}."),
                   _table(["runtime", "variant", "top-1 agreement", "max abs diff", "cosine", "relative L2", "top-1"],
                          [[html.escape(e["runtime"]), html.escape(e["variant"]), _num(e.get("top1_agreement"), "{:.4f}"),
                            _num(e.get("max_abs_diff"), "{:.3g}"), _num(e.get("cosine"), "{:.6f}"),
                            _num(e.get("relative_l2"), "{:.3g}"), _num(e.get("top1"), "{:.4f}")]
                           for e in acc["entries"]])]
    meta = (f"Model {html.escape(str(model.get('name')))} ({html.escape(str(model.get('onnx', '')))}, input "
            f"{html.escape(str(model.get('input_shape')))}); device {html.escape(str(device.get('name')))} "
            f"({html.escape(str(device.get('kind')))}), PyTorch {html.escape(str(device.get('torch')))}, kiln "
            f"{html.escape(str(device.get('kiln')))}; {html.escape(str(results.get('created', '')))}<br>"
            f"<code>{html.escape(str(results.get('command', '')))}</code>")
    page = PAGE.format(title=html.escape(title), meta=meta, sections="\n".join(sections + tables))
    path = os.path.join(out_dir, "report.html")
    with open(path, "w") as f:
        f.write(page)
    return {"html": path, "charts": written}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kiln report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", help="results JSON written by kiln compare")
    p.add_argument("-o", "--output", required=True, help="folder for the charts and report.html")
    p.add_argument("--title", help="page title (default: the model and device)")
    a = p.parse_args(argv)
    try:
        written = write_report(load_results(a.results), a.output, a.title)
    except (ValueError, OSError) as e:
        print(f"kiln: error: {e}", file=sys.stderr)
        return 1
    for name in written["charts"]:
        print(f"wrote {os.path.join(a.output, name)}.png and .svg")
    print(f"wrote {written['html']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
