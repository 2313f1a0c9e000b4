"""The models of the end-to-end tests (models.txt) and their exports, cached: shared by
tests/e2e (CPU engine vs ONNX Runtime) and tests/gpu (GPU engine vs CPU engine)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import export_model


@dataclass(frozen=True)
class E2eModel:
    name: str
    size: int  # image height and width; ignored by the text model

    def __str__(self) -> str:
        return self.name


def load_model_list() -> list[E2eModel]:
    """tests/e2e/models.txt: one model per line, an optional image size after it."""
    models = []
    with open(os.path.join(os.path.dirname(__file__), "models.txt")) as f:
        for line in f:
            fields = line.split("#", 1)[0].split()
            if fields:
                models.append(E2eModel(fields[0], int(fields[1]) if len(fields) > 1 else 64))
    return models


class ExportError(Exception):
    pass


def exported_model(cache: str, model, exporter: str) -> str:
    """The model exported with exporter, from the cache or exported now. A failed export is
    remembered too (the exporters fail the same way every time, and slowly)."""
    path = os.path.join(cache, f"{model.name}-{model.size}px-{exporter}-w{export_model.WEIGHTS_VERSION}.onnx")
    failed = path + ".export-failed"
    if os.path.exists(path):
        return path
    if os.path.exists(failed):
        with open(failed) as f:
            raise ExportError(f.read())
    spec = export_model.load_model(model.name, size=model.size)
    opset = 17 if exporter == "torchscript" else None
    try:
        export_model.export(spec, path, exporter, opset)
    except Exception as e:  # the exporters raise many types; all mean "could not export"
        message = f"{exporter} export of {model.name} failed: {type(e).__name__}: {str(e)[:2000]}"
        with open(failed, "w") as f:
            f.write(message)
        raise ExportError(message) from e
    return path


