"""Checks a Kubernetes manifest against KServe's and Kubernetes' Python API models (every field one
they define, with the type they give it), in a process of its own: KServe's gRPC protobufs and
Triton's client register the same names, so the serving tests' process cannot import both.

    python tests/e2e/kserve_schema.py MANIFEST.yaml TYPE     # prints a JSON list of the errors
"""
from __future__ import annotations

import json
import sys

import yaml


def _model_class(name: str):
    import kserve.models
    import kubernetes.client.models

    for module in (kserve.models, kubernetes.client.models):
        if hasattr(module, name):
            return getattr(module, name)
    raise AssertionError(f"no API model {name} in kserve or kubernetes")


def schema_errors(value, type_name: str, path: str) -> list[str]:
    """Where `value` (parsed YAML) leaves the OpenAPI type `type_name` of KServe's and Kubernetes'
    Python API models: unknown fields, and values of the wrong kind."""
    if type_name == "object":  # IntOrString, quantities and other free values
        return []
    # The models write containers both ways: list[X] and List[X], dict(str, X) and Dict[str, X].
    if type_name.lower().startswith("list["):
        if not isinstance(value, list):
            return [f"{path}: a list, not {value!r}"]
        return [e for i, v in enumerate(value) for e in schema_errors(v, type_name[5:-1], f"{path}[{i}]")]
    if type_name.startswith(("dict(", "Dict[")):
        if not isinstance(value, dict):
            return [f"{path}: a map, not {value!r}"]
        inner = type_name[type_name.index(",") + 1:-1].strip()
        return [e for k, v in value.items() for e in schema_errors(v, inner, f"{path}.{k}")]
    primitive = {"str": str, "bool": bool, "int": int, "float": (int, float)}
    if type_name in primitive:
        ok = isinstance(value, primitive[type_name]) and not (type_name == "int" and isinstance(value, bool))
        return [] if ok else [f"{path}: a {type_name}, not {value!r}"]
    cls = _model_class(type_name)
    if not isinstance(value, dict):
        return [f"{path}: a {type_name} map, not {value!r}"]
    fields = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    errors = []
    for key, v in value.items():
        if key not in fields:
            errors.append(f"{path}.{key}: not a field of {type_name}")
        else:
            errors += schema_errors(v, cls.openapi_types[fields[key]], f"{path}.{key}")
    return errors


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(schema_errors(yaml.safe_load(f), sys.argv[2], "")))
