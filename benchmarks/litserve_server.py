"""The same pipelines on LitServe: one LitAPI per flow (its documented pattern: a
service computes its pipeline in its own inference worker), both flows on one server.
Run with a Python that has litserve and torch (requirements-peers.txt); prints READY.

    /path/to/litserve-venv/bin/python benchmarks/litserve_server.py --port 8003
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import litserve as ls  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.pipelines import CASCADE_THRESHOLD, MLP, pick, preprocess  # noqa: E402


class _Pipeline(ls.LitAPI):
    def setup(self, device):
        self.small, self.big = MLP("small"), MLP("big")

    def decode_request(self, request):
        rows = [request] if isinstance(request, dict) else request
        return np.asarray([r["img"] for r in rows], dtype=np.uint8)

    def encode_response(self, output):
        return {"rows": output}


class Ensemble(_Pipeline):
    def predict(self, imgs):
        x = preprocess(imgs)
        a, b = self.small(x), self.big(x)
        return [
            dict(zip(("cls", "conf"), pick(a[0][i].item(), a[1][i].item(), b[0][i].item(), b[1][i].item())))
            for i in range(len(imgs))
        ]


class Cascade(_Pipeline):
    def predict(self, imgs):
        x = preprocess(imgs)
        cls, conf = self.small(x)
        out = []
        for i in range(len(imgs)):
            c, p = cls[i].item(), conf[i].item()
            if p < CASCADE_THRESHOLD:
                c2, p2 = self.big(x[i : i + 1])
                c, p = pick(c, p, c2[0].item(), p2[0].item())
            out.append({"cls": c, "conf": p})
        return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8003)
    args = p.parse_args()
    server = ls.LitServer(
        [Ensemble(api_path="/flows/ensemble"), Cascade(api_path="/flows/cascade")],
        accelerator="cpu",
        workers_per_device=1,
    )
    serve(server, args.port)


def serve(server, port: int) -> None:
    """Run ``server`` on ``port``, printing READY once its /health answers (the benchmark waits for it)."""
    import threading

    def ready():
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                print("READY", flush=True)
                return
            except OSError:
                time.sleep(0.5)

    threading.Thread(target=ready, daemon=True).start()
    server.run(host="127.0.0.1", port=port, num_api_servers=1, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
