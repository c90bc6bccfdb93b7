"""Small torch models for the examples, trained at first use on scikit-learn's digits.

Nothing is downloaded: the digits ship with scikit-learn. Images are scaled to uint8 and
enlarged to 28x28 (MNIST's shape). Trained weights are stored in the cluster's KVS, and
each model replica loads them once, when the executor builds it.

Training takes seconds to tens of seconds on a loaded 2-core machine, so the trained
weights are also kept on disk (``$FLOWSERVE_MODEL_CACHE``, default
``~/.cache/flowserve/models``) and the next run of any example reuses them. With
``FLOWSERVE_EXAMPLE_SMALL=1`` (the example tests) the models train for fewer epochs.
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from flow import current_device, current_store

MODELS = {"small": 64, "medium": 256, "big": 1024}  # name -> hidden units
EPOCHS = 15
SMALL_EPOCHS = 5  # FLOWSERVE_EXAMPLE_SMALL=1: quicker training, slightly less accurate


def digits_28() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (n, 28, 28), labels) from scikit-learn's 8x8 digits."""
    from sklearn.datasets import load_digits

    d = load_digits()
    imgs = (d.images / 16.0 * 255).astype(np.uint8)
    big = np.kron(imgs, np.ones((1, 3, 3), dtype=np.uint8))  # 24 x 24
    return np.pad(big, ((0, 0), (2, 2), (2, 2))), d.target


def mlp(hidden: int):
    import torch

    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
    )


def train(hidden: int, seed: int = 0, epochs: int = 15) -> bytes:
    """Train an MLP on the first 1500 digits; its state dict as bytes."""
    import torch

    torch.manual_seed(seed)
    x, y = digits_28()
    x = torch.tensor(preprocess_batch(x[:1500]))
    y = torch.tensor(y[:1500])
    model = mlp(hidden)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = time.monotonic()
    print(f"training a {hidden}-unit MLP on the digits for {epochs} epochs (once: the result is cached)", flush=True)
    for epoch in range(epochs):
        for i in range(0, len(x), 64):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[i : i + 64]), y[i : i + 64])
            loss.backward()
            opt.step()
        # a line an epoch: on 2 cores the whole training takes up to a minute
        print(f"  epoch {epoch + 1}/{epochs}: loss {loss.item():.3f}, {time.monotonic() - start:.0f} s", flush=True)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getvalue()


def small_mode() -> bool:
    """True when the examples should run quickly (FLOWSERVE_EXAMPLE_SMALL=1, set by the tests)."""
    return os.environ.get("FLOWSERVE_EXAMPLE_SMALL") == "1"


def cache_dir() -> Path:
    return Path(os.environ.get("FLOWSERVE_MODEL_CACHE") or Path.home() / ".cache" / "flowserve" / "models")


def trained(hidden: int, seed: int = 0, epochs: int = EPOCHS) -> bytes:
    """``train(hidden, seed, epochs)``, from the disk cache when an earlier run stored it."""
    path = cache_dir() / f"digits-mlp-h{hidden}-s{seed}-e{epochs}.pt"
    try:
        return path.read_bytes()
    except OSError:
        pass
    state = train(hidden, seed, epochs)
    try:  # write-then-rename: concurrent runs never read half a file
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as f:
            f.write(state)
        os.replace(f.name, path)
    except OSError:
        pass  # a read-only home only costs the next run the training time
    return state


def ensure_models(store, names=("small", "big"), epochs: int | None = None) -> None:
    """Train (or load from the disk cache) and store the named example models unless the
    store holds them already. ``epochs`` defaults to 15, or 5 with FLOWSERVE_EXAMPLE_SMALL=1.

    A key that holds something else is looked at, not trusted: an example model of other
    sizes (an older version of this file) is trained again; anything else (your own data
    under ``models/small``) is refused naming the key, never overwritten.

        ensure_models(cluster.kvs, names=("small", "medium", "big"))
    """
    import flowserve as fs

    if epochs is None:
        epochs = SMALL_EPOCHS if small_mode() else EPOCHS
    for name in names:
        key = f"models/{name}"
        held = store.get(key, default=None)
        if held is not None:
            problem = model_problem(held, MODELS[name])
            if problem is None:
                continue  # this example's model: trained before
            if problem != OTHER_SIZES:
                raise fs.FlowValueError(
                    f"the store's key {key!r} holds {problem}, not the examples' trained {name!r} model "
                    f"(torch state-dict bytes); remove it (`flowserve kvs rm {key}`) or keep your data under "
                    f"another key, then run this again"
                )
            print(f"{key} holds {problem}: training it again")
        store.put(key, trained(MODELS[name], epochs=epochs))


def model_problem(held, hidden: int) -> str | None:
    """None if ``held`` is a state dict of ``mlp(hidden)`` as ``torch.save`` writes it; else
    what it is instead, in a few words."""
    import torch

    if not isinstance(held, (bytes, bytearray)):
        shape = getattr(held, "shape", None)
        return f"an array {held.dtype} {tuple(shape)}" if shape is not None else f"a {type(held).__name__}"
    try:
        state = torch.load(io.BytesIO(held), weights_only=True)
    except Exception as e:  # whatever torch makes of bytes that are not its own: not a model
        return f"{len(held)} bytes that are not a torch state dict ({type(e).__name__})"
    want = mlp(hidden).state_dict()
    if not isinstance(state, dict) or set(state) != set(want):
        return "a torch object that is not an example model's state dict"
    if any(tuple(state[k].shape) != tuple(want[k].shape) for k in want):
        return OTHER_SIZES
    return None


OTHER_SIZES = "an example model of other sizes"


def preprocess_batch(imgs: np.ndarray) -> np.ndarray:
    """uint8 images -> float32 in [0, 1], normalised like the training data."""
    return (np.asarray(imgs, dtype=np.float32) / 255.0 - 0.1) / 0.3


class DigitNet:
    """A trained MLP, built once per replica; called on a whole Table (batching)."""

    name = "small"

    def __init__(self):
        import torch

        torch.set_num_threads(1)  # one executor per core: don't oversubscribe
        self.device = current_device()  # "cuda" on a GPU executor (gpu=True stages), else "cpu"
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


class MediumNet(DigitNet):
    name = "medium"


class BigNet(DigitNet):
    name = "big"
