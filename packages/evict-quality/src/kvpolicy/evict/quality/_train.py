"""Training the return predictors on attention recorded from a model.

Both predictors learn from :func:`~kvpolicy.evict.quality.record_returns` over windows of
the training text; neither sees the evaluation text. The compact predictor is a ridge fit
(milliseconds); seed 000's logits MLP has ``|V| * 256`` weights (about 50 MB for
SmolLM2's 49152-token vocabulary), so it is trained on first use and cached under
:func:`~kvpolicy.evict.quality.cache_dir`, never shipped.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvpolicy.evict.predictors import CompactReturnPredictor, fit_compact
from kvpolicy.evict.quality._model import CausalLM, cache_dir
from kvpolicy.evict.quality._record import ReturnRecord, record_returns

__all__ = [
    "held_out_record",
    "load_or_train_mlp",
    "mlp_checkpoint_path",
    "predictor_report",
    "rank_correlation",
    "record_windows",
    "text_windows",
    "train_compact",
]


def record_windows(
    lm: CausalLM,
    windows: Sequence[Any],
    horizon: int = 128,
    max_tokens: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> ReturnRecord:
    """Concatenate :func:`record_returns` over token windows.

    Args:
        lm: the model.
        windows: (n_i,) int64 torch tensors of token ids, each longer than ``horizon``.
        horizon: later queries averaged into each return.
        max_tokens: stop once this many tokens are recorded (None: all windows).
        progress: called with 1 after each window.
    """
    import torch

    if not windows:
        raise ValueError("'windows' must not be empty")
    parts: list[ReturnRecord] = []
    total = 0
    for ids in windows:
        rec = record_returns(lm, ids, horizon)
        parts.append(rec)
        total += len(rec.returns)
        if progress is not None:
            progress(1)
        if max_tokens is not None and total >= max_tokens:
            break
    record = ReturnRecord(
        logits=torch.cat([p.logits for p in parts]),
        features=np.concatenate([p.features for p in parts]),
        returns=np.concatenate([p.returns for p in parts]),
    )
    if max_tokens is not None and total > max_tokens:
        record = ReturnRecord(
            logits=record.logits[:max_tokens],
            features=record.features[:max_tokens],
            returns=record.returns[:max_tokens],
        )
    return record


def text_windows(lm: CausalLM, texts: Sequence[str], window: int = 512) -> list[Any]:
    """Split each text's tokens into consecutive windows of ``window`` tokens (tails dropped)."""
    out = []
    for text in texts:
        ids = lm.tokenizer(text, return_tensors="pt").input_ids[0]
        out += [ids[s : s + window] for s in range(0, len(ids) - window + 1, window)]
    return out


def train_compact(record: ReturnRecord, ridge: float = 1e-3) -> CompactReturnPredictor:
    """Fit the compact predictor to a record (see :func:`.fit_compact`)."""
    return fit_compact(record.features, record.returns, ridge=ridge)


def mlp_checkpoint_path(lm: CausalLM, root: pathlib.Path | None = None) -> pathlib.Path:
    """Where the logits MLP of ``lm`` is cached: ``<cache_dir>/predictors/<name>-logits-mlp.pt``."""
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in lm.name.lower())
    return (root or cache_dir()) / "predictors" / f"{slug}-logits-mlp.pt"


def load_or_train_mlp(
    lm: CausalLM,
    record: Callable[[], ReturnRecord],
    path: pathlib.Path | None = None,
    epochs: int = 8,
) -> Any:
    """Load the cached logits MLP of ``lm``, or train it on ``record()`` and cache it.

    Args:
        lm: the model whose vocabulary the MLP reads.
        record: builds the training record (called only when training).
        path: checkpoint path; default :func:`mlp_checkpoint_path`.
        epochs: training passes when training.

    Returns:
        A ``LogitsMLPPredictor``.

    Raises:
        ValueError: the cached checkpoint is for another vocabulary (delete it to retrain).
    """
    from kvpolicy.evict.predictors import load_mlp, save_mlp, train_mlp

    target = path or mlp_checkpoint_path(lm)
    if target.exists():
        return load_mlp(target, vocab_size=lm.vocab_size)
    rec = record()
    predictor = train_mlp(rec.logits, rec.returns, epochs=epochs)
    save_mlp(predictor, target)
    return predictor


def rank_correlation(predicted: Any, realised: Any) -> float:
    """Spearman's rank correlation of two (n,) arrays (ties get their mean rank).

    Raises:
        ValueError: shapes differ, fewer than 3 values, or either array is constant.
    """
    x = np.asarray(predicted, dtype=np.float64)
    y = np.asarray(realised, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size < 3:
        raise ValueError(f"need two (n,) arrays with n >= 3: shapes {x.shape}, {y.shape}")
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        raise ValueError("rank correlation of a constant array is undefined")
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(x: Any) -> Any:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.arange(x.size, dtype=np.float64)
    # Average the ranks of ties.
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def held_out_record(lm: CausalLM, text: str, tokens: int = 2048, window: int = 512) -> ReturnRecord:
    """Realised returns of the first ``tokens`` tokens of ``text``, in windows of ``window``
    (what :func:`predictor_report` scores a predictor on)."""
    ids = lm.encode(text, tokens)
    return record_windows(lm, [ids[s : s + window] for s in range(0, tokens - window + 1, window)])


def predictor_report(
    predictors: dict[str, Any], records: dict[str, ReturnRecord]
) -> dict[str, dict[str, float]]:
    """Rank correlation of each predictor's ``R̂`` with the realised returns of each record
    (``{predictor: {text: rho}}``); ``"arrival attention"`` (the feature alone) is added as
    the reference a predictor must beat to tell Token-PD more than its first observation."""
    out: dict[str, dict[str, float]] = {}
    for name, predictor in predictors.items():
        out[name] = {
            text: rank_correlation(predictor.predict(rec.features)[0], rec.returns)
            for text, rec in records.items()
        }
    out["arrival attention"] = {
        text: rank_correlation(rec.features[:, 3], rec.returns) for text, rec in records.items()
    }
    return out
