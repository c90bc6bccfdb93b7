"""``flowserve build app.py`` (executors/hosts/image_build.py, scripts/k8s/flowserve-image.sh):
a real OCI image built by buildah from a debootstrapped Debian rootfs, nothing pulled; the
image's filesystem is then entered (chroot, as its user) to run the app's flow with its
requirement installed. Needs root, buildah and debootstrap (Debian: apt-get install buildah
debootstrap); without them the build test skips, unless $FLOWSERVE_K8S_REQUIRED is set (CI),
where it fails. The first build takes about 2 minutes (debootstrap, the dependencies), later
ones about 1 (their rootfs is cached in ~/.cache/flowserve/k8s/image)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from executors.hosts.image_build import default_tag
from tests.k8s.realcluster import REQUIRE_ENV

CLI = [sys.executable, "-m", "flowserve.cli"]

APP = """\
import flowserve as fs
import humanize  # from requirements.txt

from helpers import double

flow = fs.Flow("imaged", schema={"x": int})
flow.map(lambda r: (double(r.x), humanize.intcomma(r.x)), names=["y", "text"])
"""


def build(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "build", *args], capture_output=True, text=True, timeout=900)


def test_default_tag_is_a_valid_image_name(tmp_path):
    assert default_tag(tmp_path / "My App.py") == "localhost/flowserve-my-app:latest"
    assert default_tag(tmp_path / "___.py") == "localhost/flowserve-app:latest"


def test_a_bad_build_is_refused_naming_what_is_wrong(tmp_path):
    r = build(str(tmp_path / "missing.py"))
    assert r.returncode == 2 and "no such script" in r.stderr and "missing.py" in r.stderr
    (tmp_path / "app.py").write_text(APP)
    r = build(str(tmp_path / "app.py"), "--tag", "Not A Reference")
    assert r.returncode == 2 and "'Not A Reference' is not an image reference" in r.stderr
    r = build(str(tmp_path / "app.py"), "--requirements", str(tmp_path / "nope.txt"))
    assert r.returncode == 2 and "nope.txt" in r.stderr and "no such file" in r.stderr


def _can_build() -> str | None:
    for tool in ("buildah", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install buildah debootstrap)"
    if os.geteuid() != 0:
        return "building an image needs root (debootstrap, chroot)"
    return None


@pytest.fixture
def builder():
    why = _can_build()
    if why is not None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"${REQUIRE_ENV} is set but {why}")
        pytest.skip(why)


def test_build_makes_an_image_of_the_project_the_script_and_its_requirements(builder, tmp_path):
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "helpers.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "requirements.txt").write_text("humanize\n")
    tag = f"localhost/flowserve-test-{uuid.uuid4().hex[:8]}:1"
    r = build(str(tmp_path / "app.py"), "--tag", tag)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[0] == tag and "kubectl apply -k" in r.stdout  # the reference, and how to use it
    ctr = None
    try:
        info = json.loads(
            subprocess.run(
                ["buildah", "inspect", "--type", "image", tag], capture_output=True, text=True, check=True
            ).stdout
        )
        config = info["OCIv1"]["config"]
        assert config["User"] == "10001:10001" and config["WorkingDir"] == "/app"
        assert "PYTHONPATH=/app" in config["Env"] and config["Cmd"] == ["flowserve", "--help"]
        assert len(info["OCIv1"]["rootfs"]["diff_ids"]) == 1  # one layer, from scratch: no base image
        ctr = subprocess.run(["buildah", "from", tag], capture_output=True, text=True, check=True).stdout.strip()
        root = subprocess.run(["buildah", "mount", ctr], capture_output=True, text=True, check=True).stdout.strip()
        run = subprocess.run(
            [
                "chroot",
                "--userspec=10001:10001",
                root,
                "/usr/bin/env",
                "-i",
                "PATH=/opt/flowserve/bin:/usr/local/bin:/usr/bin:/bin",
                "PYTHONPATH=/app",
                "HOME=/tmp",
                "sh",
                "-c",
                "cd /app && python -c 'import app; print(app.flow.run([{\"x\": 1234}]).to_pylist())'"
                " && flowserve --help >/dev/null && redis-server --version",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        assert "'y': 2468, 'text': '1,234'" in run.stdout and "Redis server" in run.stdout
    finally:
        if ctr is not None:
            subprocess.run(["buildah", "rm", ctr], capture_output=True)
        subprocess.run(["buildah", "rmi", tag], capture_output=True)
