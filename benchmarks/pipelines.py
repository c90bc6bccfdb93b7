"""The benchmark pipelines as plain numpy/torch code, shared by every system measured.

Deliberately free of FlowServe imports: the floor server and the Ray Serve app run this
same code in their own processes (Ray Serve in its own virtualenv).

Ensemble (the runtime issue's benchmark): preprocess (uint8 28x28 -> normalised float32),
two MLPs (hidden 64 and 1024, fixed seeds) in parallel, keep the more confident answer.
Cascade: the small MLP first; only rows it is unsure of go to the big one.
"""

from __future__ import annotations

import numpy as np

HIDDEN = {"small": 64, "big": 1024}
CASCADE_THRESHOLD = 0.5


def preprocess(img: np.ndarray) -> np.ndarray:
    return ((np.asarray(img, dtype=np.float32) / 255.0) - 0.1307) / 0.3081


class MLP:
    """A fixed-seed MLP 784 -> hidden -> 10; call on (n, 28, 28) floats -> (cls, conf)."""

    def __init__(self, name: str):
        import torch

        torch.set_num_threads(1)  # one core per worker process, in every system
        torch.manual_seed(HIDDEN[name])
        self.model = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(784, HIDDEN[name]), torch.nn.ReLU(), torch.nn.Linear(HIDDEN[name], 10)
        ).eval()

    def __call__(self, x: np.ndarray):
        import torch

        with torch.inference_mode():
            probs = torch.softmax(self.model(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))), dim=1)
            conf, cls = probs.max(dim=1)
        return cls.numpy().astype(np.int64), conf.numpy().astype(np.float64)


def pick(cls_a, conf_a, cls_b, conf_b):
    return (cls_a, conf_a) if conf_a >= conf_b else (cls_b, conf_b)


def sample_image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(28, 28), dtype=np.uint8)
