"""Fixtures of the kernels tests.

Without a CUDA GPU, Triton's interpreter runs the kernels on CPU tensors; it must be
switched on before triton is first imported, so it is set here, at collection. The
ahead-of-time compile tests need the real compiler and run in a subprocess without it.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from kvpolicy.kernels import CompactWeights, MLPWeights

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture
def device() -> torch.device:
    """Where the Triton backend runs: the GPU when there is one, else the interpreter."""
    return torch.device("cuda" if HAS_CUDA else "cpu")


def make_logits(b: int, v: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(b, v) logits with a peaked softmax, as a language model gives."""
    z = torch.randn(b, v) * 2.0
    z[:, torch.randint(0, v, (3,))] += 8.0
    return z.to(device=device, dtype=dtype)


def make_mlp(v: int, hidden: int = 16) -> MLPWeights:
    """A random logits MLP (V -> hidden -> 1) with outputs away from 0 and 1."""
    return MLPWeights(
        torch.randn(hidden, v) / v**0.5,
        torch.randn(hidden) * 0.1,
        torch.randn(hidden) * 0.5,
        0.2,
        risk=0.03,
    )


def make_compact() -> CompactWeights:
    """Weights like the shipped compact predictor's."""
    return CompactWeights((-2.0, -0.3, 1.1, -0.4, 0.8, 3.0, 0.2), residual_variance=0.6)


@pytest.fixture(name="make_logits")
def _make_logits() -> object:
    """Factory of logits: ``make_logits(b, v, dtype, device)``."""
    return make_logits


@pytest.fixture(name="make_mlp")
def _make_mlp() -> object:
    """Factory of MLP weights: ``make_mlp(v, hidden=16)``."""
    return make_mlp


@pytest.fixture(name="compact")
def _compact() -> CompactWeights:
    """Compact-predictor weights like the shipped ones."""
    return make_compact()
