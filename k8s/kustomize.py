"""A kustomize base of the rendered manifests (``flowserve k8s render --kustomize DIR``): one
file per object and a ``kustomization.yaml`` listing them in apply order, for ``kubectl
apply -k DIR`` or as the base that overlays patch (image, replicas, resources).

    write_base(render(config), "k8s/base")     # k8s/base/kustomization.yaml + the objects

A render into a directory that holds an earlier base replaces it: the files the earlier
``kustomization.yaml`` listed and this one does not (an object no longer rendered) are
removed; other files there are left alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from flow.configuration import ConfigError
from k8s.manifests import to_yaml

KUSTOMIZATION = "kustomization.yaml"


def file_name(manifest: dict) -> str:
    """``<kind>-<name>.yaml`` in lower case, e.g. ``deployment-flowserve-gateway.yaml``."""
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    return re.sub(r"[^a-z0-9.-]+", "-", f"{kind}-{name}".lower()) + ".yaml"


def kustomization(files: Sequence[str]) -> str:
    lines = [
        "# Rendered by `flowserve k8s render --kustomize`: apply with `kubectl apply -k`, or use as a base.",
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "resources:",
        *(f"- {f}" for f in files),
    ]
    return "\n".join(lines) + "\n"


def _listed(directory: Path) -> list[str]:
    """The resources an earlier base's kustomization.yaml lists (its own files only)."""
    path = directory / KUSTOMIZATION
    if not path.is_file():
        return []
    import yaml

    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"--kustomize {str(directory)!r}: its {KUSTOMIZATION} is not YAML ({e}); remove it") from None
    return [r for r in doc.get("resources", []) if isinstance(r, str) and "/" not in r and r.endswith(".yaml")]


def write_base(manifests: Sequence[dict], directory: str | os.PathLike) -> list[Path]:
    """Write ``manifests`` as a kustomize base into ``directory`` (made if missing); returns
    the files written, kustomization.yaml last. ``ConfigError`` if it cannot be written."""
    out = Path(directory)
    names = [file_name(m) for m in manifests]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"--kustomize: two objects would share the file {dup[0]}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        stale = set(_listed(out)) - set(names)
        written = []
        for name, manifest in zip(names, manifests):
            written.append(_write(out / name, to_yaml([manifest])))
        written.append(_write(out / KUSTOMIZATION, kustomization(names)))
        for name in sorted(stale):
            (out / name).unlink(missing_ok=True)
    except OSError as e:
        raise ConfigError(f"--kustomize {str(directory)!r}: cannot write it: {e.strerror or e}") from None
    return written


def _write(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
