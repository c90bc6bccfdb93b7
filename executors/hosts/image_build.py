"""``flowserve build app.py``: an OCI image of FlowServe plus a user's script and its
requirements, built by buildah (Debian's ``buildah`` package) from a Debian rootfs made
with debootstrap: no base image is pulled from any registry.

    flowserve build app.py                          -> localhost/flowserve-app:latest
    flowserve build app.py --tag registry.example.com/team/app:1 --out app.tar

The script lands in ``/app`` with the ``.py`` files beside it (the modules it imports) and
``/app`` on ``PYTHONPATH``; its requirements (``requirements.txt`` beside it, or
``--requirements FILE``) are pip-installed beside FlowServe's own dependencies, whose
versions are kept. The rest is the image of ``scripts/k8s/flowserve-image.sh``, which does
the work: the non-root user 10001, ``/var/cache/flowserve``, redis-server on PATH for the KVS
pod. It needs root (debootstrap and chroot build the filesystem) and FlowServe's source tree
(the script is not part of an installed wheel).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from flow.configuration import ConfigError
from flow.errors import AccessDeniedError, FlowDefinitionError, NotInstalledError

ROOT = Path(__file__).resolve().parents[2]
IMAGE_SCRIPT = ROOT / "scripts" / "k8s" / "flowserve-image.sh"
_REF = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[\w][\w.-]{0,127})?$")


def default_tag(script: Path) -> str:
    """``localhost/flowserve-<script name>:latest``, the name made a valid image name."""
    stem = re.sub(r"[^a-z0-9]+", "-", script.stem.lower()).strip("-") or "app"
    return f"localhost/flowserve-{stem}:latest"


def check_build(script: Path, tag: str, requirements: Path | None) -> None:
    """Refuse what cannot be built, naming it: a missing script or requirements file, a
    bad image reference, no buildah or debootstrap, not root, no source tree."""
    if not script.is_file():
        raise ConfigError(f"flowserve build: no such script {str(script)!r}")
    if script.suffix != ".py":
        raise ConfigError(f"flowserve build: {str(script)!r} is not a Python script (.py)")
    if requirements is not None and not requirements.is_file():
        raise ConfigError(f"flowserve build: --requirements {str(requirements)!r}: no such file")
    if not _REF.match(tag):
        raise ConfigError(
            f"flowserve build: --tag {tag!r} is not an image reference (lower-case name[:tag], e.g. localhost/app:1)"
        )
    if not IMAGE_SCRIPT.is_file():
        raise NotInstalledError(
            f"flowserve build needs FlowServe's source tree ({IMAGE_SCRIPT} is missing): "
            "build from a checkout installed with `pip install -e .`"
        )
    for tool, package in (("buildah", "buildah"), ("debootstrap", "debootstrap"), ("chroot", "coreutils")):
        if shutil.which(tool) is None:
            raise NotInstalledError(f"flowserve build needs {tool}: apt-get install {package} (Debian, Ubuntu)")
    if os.geteuid() != 0:
        raise AccessDeniedError("flowserve build needs root (debootstrap and chroot build the image's filesystem)")


def build_image(script: Path, tag: str, requirements: Path | None = None, out: Path | None = None) -> str:
    """Build the image; returns its reference. The build's progress goes to stderr."""
    script = script.resolve()
    if requirements is None and (script.parent / "requirements.txt").is_file():
        requirements = script.parent / "requirements.txt"
    check_build(script, tag, requirements)
    cmd = ["bash", str(IMAGE_SCRIPT), "app", str(script), tag, str(requirements.resolve()) if requirements else ""]
    if out is not None:
        cmd.append(str(out.resolve()))
    r = subprocess.run(cmd, stdout=sys.stderr, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise FlowDefinitionError(f"flowserve build: building {tag} failed (exit {r.returncode}); its log is above")
    return tag


def usage(tag: str, script: Path, out: Path | None) -> str:
    """How to use a built image, printed after the build."""
    remote = f"REGISTRY/{tag.split('/', 1)[-1]}"
    lines = [
        tag,
        "",
        f"Check it: podman run --rm {tag} python -c 'import {script.stem}'",
        "On Kubernetes: push it where your nodes pull from, render the manifests with it, apply them, deploy:",
        f"  podman push {tag} {remote}",
        f"  flowserve k8s render --image {remote} --script {script.name} --kustomize k8s/",
        "  kubectl apply -k k8s/",
        f"  then deploy its flows (docs/kubernetes.md): the executors import {script.name}'s requirements from the image",
    ]
    if out is not None:
        lines.insert(2, f"OCI archive: {out} (podman load -i, ctr images import, skopeo copy oci-archive:...)")
    return "\n".join(lines) + "\n"


def cmd_build(args) -> int:
    script = Path(args.script)
    tag = args.tag or default_tag(script)
    out = Path(args.out) if args.out else None
    requirements = Path(args.requirements) if args.requirements else None
    build_image(script, tag, requirements, out)
    print(usage(tag, script, out), end="")
    return 0


def add_build_command(sub) -> None:
    """Add ``build`` to a ``flowserve`` parser's subcommands."""
    b = sub.add_parser(
        "build",
        help="build an OCI image of FlowServe plus a script and its requirements (buildah, no base image pulled)",
        description="Build an OCI image: a Debian rootfs (debootstrap), FlowServe and its dependencies, the script "
        "and the .py files beside it in /app, its requirements. Needs root, buildah and debootstrap.",
    )
    b.add_argument("script", help="the app's .py file (its flows)")
    b.add_argument("--tag", help="the image reference (default localhost/flowserve-<script>:latest)")
    b.add_argument("--requirements", help="a pip requirements file (default: requirements.txt beside the script)")
    b.add_argument("--out", help="also write the image as an OCI archive to this file")
    b.set_defaults(fn=cmd_build)
