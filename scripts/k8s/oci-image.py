#!/usr/bin/env python3
"""Write an OCI image archive (for `ctr images import`) from a directory tree: one layer,
nothing pulled from any registry. The layer is streamed through a temporary file (a
FlowServe rootfs is about a gigabyte) and left uncompressed unless --gzip: the archive goes
straight into containerd on the same machine.

    oci-image.py ROOTFS_DIR localhost/busybox:1 busybox.tar /bin/sh -c 'echo hi'
    oci-image.py --user 10001:10001 --workdir /home/flowserve --env PATH=/opt/venv/bin:/usr/bin:/bin \
        --exclude dev --exclude proc ROOTFS_DIR localhost/flowserve:dev flowserve.tar flowserve --help
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile

CHUNK = 1 << 20


def digest(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def write_layer(src: str, path: str, exclude: list[str]) -> None:
    """``src`` as a tar at ``path``; each excluded directory stays, empty (mount points)."""
    skip = {e.strip("/") for e in exclude}

    def keep(info: tarfile.TarInfo):
        rel = info.name[2:] if info.name.startswith("./") else info.name
        return None if any(rel.startswith(s + "/") for s in skip) else info

    with tarfile.open(path, mode="w", format=tarfile.PAX_FORMAT) as t:
        t.add(src, arcname=".", filter=keep)


def main(
    src: str,
    ref: str,
    out: str,
    cmd: list[str],
    env: list[str],
    user: str | None,
    workdir: str | None,
    exclude: list[str],
    compress: bool,
) -> None:
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out))) as tmp:
        layer = os.path.join(tmp, "layer.tar")
        write_layer(src, layer, exclude)
        diff_id = file_digest(layer)
        media = "application/vnd.oci.image.layer.v1.tar"
        if compress:
            with open(layer, "rb") as f, gzip.GzipFile(layer + ".gz", "wb", compresslevel=1, mtime=0) as g:
                shutil.copyfileobj(f, g, CHUNK)
            os.replace(layer + ".gz", layer)
            media += "+gzip"
        blob, size = file_digest(layer), os.path.getsize(layer)
        image_config = {"Cmd": cmd, "Env": env or ["PATH=/usr/local/bin:/usr/bin:/bin"]}
        if user:
            image_config["User"] = user
        if workdir:
            image_config["WorkingDir"] = workdir
        config = json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": image_config,
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            }
        ).encode()
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": digest(config),
                    "size": len(config),
                },
                "layers": [{"mediaType": media, "digest": blob, "size": size}],
            }
        ).encode()
        index = json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": digest(manifest),
                        "size": len(manifest),
                        "annotations": {"org.opencontainers.image.ref.name": ref, "io.containerd.image.name": ref},
                    }
                ],
            }
        ).encode()
        with tarfile.open(out, "w") as t:
            for name, b in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)] + [
                ("blobs/sha256/" + digest(b)[7:], b) for b in (config, manifest)
            ]:
                info = tarfile.TarInfo(name)
                info.size = len(b)
                t.addfile(info, io.BytesIO(b))
            t.add(layer, arcname="blobs/sha256/" + blob[7:])


if __name__ == "__main__":
    p = argparse.ArgumentParser(usage=__doc__)
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE in the image's environment (repeat)")
    p.add_argument("--user", help="UID[:GID] the container runs as by default")
    p.add_argument("--workdir")
    p.add_argument("--exclude", action="append", default=[], help="a directory whose contents stay out (repeat)")
    p.add_argument("--gzip", action="store_true", help="compress the layer (for copying the archive elsewhere)")
    p.add_argument("rootfs")
    p.add_argument("ref")
    p.add_argument("out")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    if not a.cmd:
        p.error("the image's command is missing")
    main(a.rootfs, a.ref, a.out, a.cmd, a.env, a.user, a.workdir, a.exclude, a.gzip)
