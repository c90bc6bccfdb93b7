"""Small torch models for the examples, trained at first use on scikit-learn's digits.

Nothing is downloaded: the digits ship with scikit-learn. Images are scaled to uint8 and
enlarged to 28x28 (MNIST's shape). Trained weights are stored in the cluster's KVS, and
each model replica loads them once, when the executor builds it.
"""

from __future__ import annotations

import io

import numpy as np

from flow import current_store

MODELS = {"small": 64, "big": 1024}  # name -> hidden units


def digits_28() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (n, 28, 28), labels) from scikit-learn's 8x8 digits."""
    from sklearn.datasets import load_digits

    d = load_digits()
    imgs = (d.images / 16.0 * 255).astype(np.uint8)
    big = np.kron(imgs, np.ones((1, 3, 3), dtype=np.uint8))  # 24 x 24
    return np.pad(big, ((0, 0), (2, 2), (2, 2))), d.target


def mlp(hidden: int):
    import torch

    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def train(hidden: int, seed: int = 0, epochs: int = 15) -> bytes:
    """Train an MLP on the first 1500 digits; its state dict as bytes."""
    import torch

    torch.manual_seed(seed)
    x, y = digits_28()
    x = torch.tensor(preprocess_batch(x[:1500]))
    y = torch.tensor(y[:1500])
    model = mlp(hidden)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(epochs):
        for i in range(0, len(x), 64):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[i:i + 64]), y[i:i + 64])
            loss.backward()
            opt.step()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getvalue()


def ensure_models(store) -> None:
    """Train and store the example models unless the store has them already."""
    for name, hidden in MODELS.items():
        key = f"models/{name}"
        if not store.exists(key):
            store.put(key, train(hidden))


def preprocess_batch(imgs: np.ndarray) -> np.ndarray:
    """uint8 images -> float32 in [0, 1], normalised like the training data."""
    return (np.asarray(imgs, dtype=np.float32) / 255.0 - 0.1) / 0.3


class DigitNet:
    """A trained MLP, built once per replica; called on a whole Table (batching)."""

    name = "small"

    def __init__(self):
        import torch

        torch.set_num_threads(1)  # one executor per core: don't oversubscribe
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = mlp(MODELS[self.name])
        state = torch.load(io.BytesIO(current_store().get(f"models/{self.name}")), weights_only=True)
        self.model.load_state_dict(state)
        self.model.eval().to(self.device)

    def __call__(self, table):
        import torch

        with torch.inference_mode():
            logits = self.model(torch.from_numpy(np.ascontiguousarray(table["img"])).to(self.device))
            probs = torch.softmax(logits, dim=1)
            conf, cls = probs.max(dim=1)
        return cls.cpu().numpy().astype(np.int64), conf.cpu().numpy().astype(np.float64)


class SmallNet(DigitNet):
    name = "small"


class BigNet(DigitNet):
    name = "big"
