"""The Dockerfile's structure (no Docker engine here: it is parsed and linted, not built)."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import pytest
import tomllib

from k8s.kube_config import KubeConfig
from k8s.manifests import APP_UID, ARTIFACT_CACHE

ROOT = Path(__file__).resolve().parents[2]


def parse(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: continuations joined, comments and blanks dropped."""
    out, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            buf += line[:-1].rstrip() + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, "the Dockerfile ends inside a continued line"
    return out


@pytest.fixture(scope="module")
def instructions():
    return parse((ROOT / "Dockerfile").read_text())


def stages(instructions):
    """Global ARG defaults, and the instructions of each stage (split at FROM)."""
    args, result = {}, []
    for word, rest in instructions:
        if word == "FROM":
            result.append([(word, rest)])
        elif result:
            result[-1].append((word, rest))
        elif word == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
    return args, result


def substitute(value: str, args: dict) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), value)


def test_parse_handles_continuations():
    assert parse("FROM a:1\n# c\nRUN x \\\n  && y\n\nUSER 1\n") == [("FROM", "a:1"), ("RUN", "x && y"), ("USER", "1")]


def test_base_images_are_pinned_python_311_slim_never_latest(instructions):
    args, st = stages(instructions)
    assert len(st) >= 2  # build stage + a runtime stage without the build tools' leftovers
    for s in st:
        image = substitute(s[0][1].split()[0], args)
        repo, _, tag = image.rpartition(":")
        assert repo == "python" and tag.startswith("3.11-slim"), image
        assert tag != "latest"


def test_runs_as_the_non_root_user_the_manifests_expect(instructions):
    _, st = stages(instructions)
    final = st[-1]
    users = [rest for word, rest in final if word == "USER"]
    assert users, "the runtime stage must switch to a non-root USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0  # numeric: runAsNonRoot can verify it
    assert int(uid) == APP_UID and (not gid or int(gid) == APP_UID)
    last_user = max(i for i, (w, _) in enumerate(final) if w == "USER")
    assert not any(w == "RUN" for w, _ in final[last_user:]), "RUN after USER: the image build needs root there"


def test_command_is_exec_form_and_no_add(instructions):
    for word, rest in instructions:
        assert word != "ADD", "use COPY (ADD fetches URLs and unpacks archives implicitly)"
        if word in ("CMD", "ENTRYPOINT"):
            assert isinstance(json.loads(rest), list), f"{word} must be in exec form: {rest}"


def test_pip_keeps_no_cache_and_torch_is_optional_cpu(instructions):
    args, st = stages(instructions)
    runs = [rest for word, rest in instructions if word == "RUN" and "pip install" in rest]
    assert runs and all("--no-cache-dir" in r for r in runs)
    build_args = {rest.partition("=")[0]: rest.partition("=")[2] for s in st for w, rest in s if w == "ARG"}
    assert build_args["TORCH_VERSION"] in ('""', "")  # no torch unless asked for
    assert "/whl/cpu" in build_args["TORCH_INDEX_URL"]
    assert any('"torch==$TORCH_VERSION"' in r and "--index-url" in r for r in runs)


def test_copies_every_package_setuptools_installs(instructions):
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = set()
    for word, rest in instructions:
        if word == "COPY" and "--from" not in rest:
            copied.update(p.rstrip("/").lstrip("./") for p in rest.split()[:-1])
    assert packages <= copied, packages - copied
    assert {"pyproject.toml", "README.md"} <= copied  # pyproject's readme is read at install


def test_dockerignore_keeps_the_sources_and_drops_the_rest(instructions):
    patterns = [
        p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")
    ]

    def ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p.lstrip("*/")) for p in patterns)

    for kept in ("pyproject.toml", "README.md", "flow", "optimizer", "executors", "kvs", "k8s"):
        assert not ignored(kept), kept
    for dropped in (".git", "tests", "benchmarks", "__pycache__", "flowserve.egg-info", ".venv"):
        assert ignored(dropped), dropped


def test_ports_and_paths_match_the_manifests(instructions):
    cfg = KubeConfig()
    exposed = {int(p) for word, rest in instructions if word == "EXPOSE" for p in rest.split()}
    assert exposed == {cfg.gateway_port, cfg.gateway_results_port, cfg.executor_port}
    env = " ".join(rest for word, rest in instructions if word == "ENV")
    assert f"FLOWSERVE_ARTIFACT_CACHE={ARTIFACT_CACHE}" in env
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # the root filesystem is read-only in the pods
