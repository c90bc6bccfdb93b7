#!/usr/bin/env python3
"""Write an OCI image archive (for `ctr images import`) from a directory tree: one layer,
nothing pulled from any registry.

    oci-image.py ROOTFS_DIR localhost/busybox:1 busybox.tar /bin/sh -c 'echo hi'
"""

import gzip
import hashlib
import io
import json
import sys
import tarfile


def digest(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def main(src: str, ref: str, out: str, cmd: list[str]) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as t:
        t.add(src, arcname=".")
    layer = raw.getvalue()
    gz = gzip.compress(layer, mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": cmd, "Env": ["PATH=/bin:/usr/bin:/usr/local/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [digest(layer)]},
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
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(gz), "size": len(gz)}
            ],
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
            ("blobs/sha256/" + digest(b)[7:], b) for b in (config, manifest, gz)
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(b)
            t.addfile(info, io.BytesIO(b))


if __name__ == "__main__":
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
