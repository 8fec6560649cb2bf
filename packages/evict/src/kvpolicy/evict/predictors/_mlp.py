"""Seed 000's return predictor: an MLP from next-token logits (|V| -> 256 -> 1), in torch.

Sec. 4 of seed 000: "we append a one-hidden-layer MLP f_θ: R^|V| -> [0, 1] and train it
self-supervised to minimise E[(f_θ(z_{i,k}) - R_{i,k})²]". The input here is the
log-softmax of the logits, which is what the logits say about the next token with the
arbitrary additive constant removed; the output goes through a sigmoid so it lies in
[0, 1]. The MLP gives no risk of its own: :class:`LogitsMLPPredictor` reports the mean
squared training residual as every token's σ̂².
"""

from __future__ import annotations

import math
import pathlib
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from kvpolicy.evict._kernels import mlp_returns
from kvpolicy.evict.predictors._validate import as_feature_matrix

__all__ = ["MLP_HIDDEN", "LogitsMLPPredictor", "load_mlp", "save_mlp", "train_mlp"]

MLP_HIDDEN = 256
"""Hidden width of seed 000's predictor."""

_FORMAT = "kvpolicy-logits-mlp"


def _network(vocab_size: int, hidden: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(vocab_size, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1),
        torch.nn.Sigmoid(),
    )


class LogitsMLPPredictor:
    """f_θ(z) of seed 000 (Sec. 4): predicted return of a token from its step's logits."""

    __slots__ = ("_net", "risk", "vocab_size")

    def __init__(self, net: torch.nn.Sequential, risk: float = 0.0) -> None:
        """Wrap a ``vocab_size -> hidden -> 1`` network (see :func:`train_mlp`).

        Args:
            net: Linear(vocab_size, hidden), ReLU, Linear(hidden, 1), Sigmoid.
            risk: σ̂² reported for every token, finite and >= 0.
        """
        first = net[0]
        if not isinstance(first, torch.nn.Linear):
            raise TypeError(f"'net' must start with a Linear layer: {type(first).__name__}")
        if not (math.isfinite(risk) and risk >= 0):
            raise ValueError(f"'risk' must be finite and >= 0: {risk!r}")
        self._net = net.eval()
        self.risk = float(risk)
        self.vocab_size = int(first.in_features)

    @property
    def network(self) -> torch.nn.Sequential:
        """The torch network (for training or moving to a device)."""
        return self._net

    def predict(
        self, features: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Predict returns and risks from logits.

        Args:
            features: (n, vocab_size) float64 next-token logits at each token's step.

        Returns:
            ``(returns, risks)``: (n,) float64 in [0, 1] and (n,) float64 >= 0.
        """
        z = as_feature_matrix(features, self.vocab_size)
        with torch.no_grad():
            x = torch.log_softmax(torch.from_numpy(z).float(), dim=-1)
            out = self._net(x)[:, 0].double().numpy()
        return out, np.full(len(out), self.risk)

    def predict_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Returns for (n, vocab_size) float logits as an (n,) float32 tensor (no numpy trip).

        CUDA logits go through kvpolicy-kernels' fused Triton kernel when it is installed.
        """
        fused = mlp_returns(self, logits)
        if fused is not None:
            return fused  # type: ignore[no-any-return]
        with torch.no_grad():
            out: torch.Tensor = self._net(torch.log_softmax(logits.float(), dim=-1))[:, 0]
        return out


def train_mlp(
    logits: torch.Tensor,
    targets: NDArray[np.float64],
    *,
    hidden: int = MLP_HIDDEN,
    epochs: int = 30,
    batch_size: int = 256,
    lr: float = 1e-3,
    weight_decay: float = 1e-4,
    seed: int = 0,
) -> LogitsMLPPredictor:
    """Train f_θ self-supervised: minimise the squared error to realised returns (Sec. 4).

    Args:
        logits: (n, vocab_size) float logits (float16/32) recorded at each token's step.
        targets: (n,) float64 realised returns in [0, 1] of the same tokens.
        hidden: hidden width (seed 000: 256).
        epochs: passes over the data (Adam).
        batch_size: minibatch size.
        lr: Adam learning rate.
        weight_decay: AdamW decoupled weight decay.
        seed: seed of the initialisation and the shuffling.

    Returns:
        The trained predictor; its ``risk`` is the final mean squared training residual.
    """
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2:
        raise ValueError(
            f"'logits' must be a 2-D tensor (n, vocab_size): {getattr(logits, 'shape', logits)!r}"
        )
    y = np.asarray(targets, dtype=np.float64)
    if y.shape != (logits.shape[0],):
        raise ValueError(f"'targets' must have shape ({logits.shape[0]},): {y.shape}")
    if not np.isfinite(y).all() or (y < 0).any() or (y > 1).any():
        raise ValueError("'targets' must be finite and in [0, 1]")
    for name, value in (("hidden", hidden), ("epochs", epochs), ("batch_size", batch_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"'{name}' must be an int >= 1: {value!r}")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = _network(int(logits.shape[1]), hidden)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    yt = torch.from_numpy(y).float()
    n = logits.shape[0]
    net.train()
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            x = torch.log_softmax(logits[idx].float(), dim=-1)
            loss = torch.mean((net(x)[:, 0] - yt[idx]) ** 2)
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
    net.eval()
    with torch.no_grad():
        mse = 0.0
        for start in range(0, n, batch_size):
            x = torch.log_softmax(logits[start : start + batch_size].float(), dim=-1)
            mse += float(((net(x)[:, 0] - yt[start : start + batch_size]) ** 2).sum())
    return LogitsMLPPredictor(net, risk=mse / n)


def save_mlp(predictor: LogitsMLPPredictor, path: str | pathlib.Path) -> None:
    """Write ``predictor`` to ``path`` (a torch checkpoint of about 50 MB for |V| = 49152)."""
    net = predictor.network
    first = net[0]
    assert isinstance(first, torch.nn.Linear)
    hidden = first.out_features
    doc: dict[str, Any] = {
        "format": _FORMAT,
        "vocab_size": predictor.vocab_size,
        "hidden": int(hidden),
        "risk": predictor.risk,
        "state_dict": net.state_dict(),
    }
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(doc, tmp)
    tmp.replace(path)


def load_mlp(path: str | pathlib.Path, vocab_size: int | None = None) -> LogitsMLPPredictor:
    """Read a checkpoint written by :func:`save_mlp`.

    Args:
        path: the checkpoint file.
        vocab_size: the vocabulary the caller's model has; None accepts any.

    Raises:
        ValueError: not an MLP checkpoint, tensors of the wrong shape, or a vocabulary
            other than ``vocab_size``.
    """
    doc = torch.load(pathlib.Path(path), map_location="cpu", weights_only=True)
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise ValueError(f"'path' is not a {_FORMAT} checkpoint: {path}")
    vocab, hidden = int(doc["vocab_size"]), int(doc["hidden"])
    if vocab_size is not None and vocab != vocab_size:
        raise ValueError(
            f"checkpoint {path} has vocab_size {vocab}, expected {vocab_size} (the model's)"
        )
    net = _network(vocab, hidden)
    expected = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    state = doc["state_dict"]
    got = {k: tuple(v.shape) for k, v in state.items()}
    if got != expected:
        raise ValueError(f"checkpoint {path} has tensors of shape {got}, expected {expected}")
    net.load_state_dict(state)
    return LogitsMLPPredictor(net, risk=float(doc["risk"]))
