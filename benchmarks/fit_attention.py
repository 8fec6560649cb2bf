"""Fit the simulator's attention model to SmolLM2-135M and check it where eviction needs it.

Records the full-cache attention of SmolLM2-135M-Instruct (averaged over layers and heads)
on the first ``--tokens`` tokens of three texts (Python's pydoc topics, GPL-3, Apache-2.0),
fits :class:`kvpolicy.sim.AttentionModel` to the three jointly, and writes to ``--out``:

- ``fit.json``: the parameters, the recorded and synthetic statistics (per-distance mean
  attention, sink share, top-k mass), and the attention recall of FIFO, LRU, H2O,
  sink+window and Token-PD at budgets 25% and 50% replayed on each recorded matrix and on
  three draws of the fitted model (with and without the per-query noise), and per layer on
  GPL-3; the fit with ``gamma`` held at 0, and both fits against recordings of twice the
  length (pydoc, GPL-3);
- ``attention_fit.png``: per-distance mean attention, recorded vs model.

These are the numbers of ``integrations/sim/ATTENTION_FIT.md``. Needs kvpolicy-evict-quality
(the harness); about five minutes on two CPU cores.

    python benchmarks/fit_attention.py --out /tmp/attention-fit
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

import numpy as np

from kvpolicy.kvmodel import EVICTION, build
from kvpolicy.sim import AttentionModel, fit_attention
from kvpolicy.sim._attention_fit import attention_recall, attention_summary

POLICIES = ("fifo", "lru", "h2o", "sink-window", "token-pd")
BUDGETS = (0.25, 0.5)
SEEDS = (100, 101, 102)


def texts() -> dict[str, str]:
    from kvpolicy.evict.quality import LICENSES_DIR, default_text

    return {
        "pydoc_data.topics": default_text(),
        "GPL-3": (LICENSES_DIR / "GPL-3").read_text(errors="replace"),
        "Apache-2.0": (LICENSES_DIR / "Apache-2.0").read_text(errors="replace"),
    }


def record(lm: Any, text: str, tokens: int) -> np.ndarray:
    """(layers, T, T) float64 attention of ``lm`` on ``text``: head mean, rows renormalised."""
    from kvpolicy.evict.quality import window_attention

    _, attention = window_attention(lm, lm.encode(text, tokens))
    mass = attention.mean(dim=1).double().numpy()
    out: np.ndarray = mass / mass.sum(axis=2, keepdims=True)
    return out


def averaged(layers: np.ndarray) -> np.ndarray:
    """(T, T) mean over layers of a (layers, T, T) recording, rows renormalised."""
    a = layers.mean(axis=0)
    out: np.ndarray = a / a.sum(axis=1, keepdims=True)
    return out


def expected_row(model: AttentionModel, t: int) -> np.ndarray:
    """(t + 1,) the model's attention of query t with every z = 1."""
    w = model.weights(np.arange(t + 1, dtype=np.int64), t + 1, np.ones(t + 1))
    out: np.ndarray = w / w.sum()
    return out


def beyond(recorded: list[np.ndarray], models: dict[str, AttentionModel]) -> dict[str, Any]:
    """Sink share, 16-newest share and mean attention at a few distances of 2T-token
    recordings against each model's expected weights (the table "Beyond the fitted length")."""
    n = recorded[0].shape[0]
    rows: dict[str, dict[str, float]] = {}

    def add(name: str, real: float, model_value: Any) -> None:
        fitted = {k: float(np.mean(model_value(m))) for k, m in models.items()}
        rows[name] = {"recorded": real, **fitted}

    for lo, hi in ((n // 8, n // 4), (n // 4, n // 2), (n // 2, 3 * n // 4), (3 * n // 4, n)):
        qs = np.arange(lo, hi, 8)
        add(
            f"sink share, queries {lo}-{hi - 1}",
            float(np.mean([a[lo:hi, 0].mean() for a in recorded])),
            lambda m, qs=qs: [expected_row(m, int(t))[0] for t in qs],
        )
    qs = np.arange(3 * n // 4, n, 8)
    add(
        f"16 newest keys, queries {qs[0]}-{n - 1}",
        float(np.mean([[a[t, t - 15 : t + 1].sum() for t in qs] for a in recorded])),
        lambda m: [expected_row(m, int(t))[-16:].sum() for t in qs],
    )
    for d in (1, 16, 256, n // 2):
        add(
            f"distance {d}, queries {qs[0]}-{n - 1}",
            float(np.mean([a[qs, qs - d].mean() for a in recorded])),
            lambda m, d=d: [expected_row(m, int(t))[t - d] for t in qs],
        )
    return rows


def recall_table(a: np.ndarray) -> dict[str, float]:
    """``"policy@budget"`` -> attention recall on ``a`` (H2O keeps a window of B // 2)."""
    n = a.shape[0]
    out = {}
    for b in BUDGETS:
        k = round(b * n)
        for name in POLICIES:
            policy = build(EVICTION, name, {"recent_window": k // 2} if name == "h2o" else None)
            out[f"{name}@{b}"] = attention_recall(a, policy, k)
    return out


def mean_dicts(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def draws(model: AttentionModel, tokens: int, noise: bool) -> list[np.ndarray]:
    out = []
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        out.append(model.matrix(model.token_scores(rng, tokens), rng if noise else None))
    return out


def plot(path: pathlib.Path, recorded: list[np.ndarray], model: AttentionModel) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = recorded[0].shape[0]
    d = np.unique(np.geomspace(1, n // 2, 60).round().astype(int))
    rows = np.arange(n // 2, n)
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=90)
    for a in recorded:
        ax.loglog(d, [a[rows, rows - k].mean() for k in d], color="0.6", lw=1)
    t = rows.astype(np.float64)
    z_row = np.array([model.normaliser(int(x) + 1, x + 1) for x in t])
    body = np.array([model.body_weight(int(x) + 1) for x in t])
    ax.loglog(
        d,
        [
            float(
                np.mean((model.recency_weight * max(k, 1) ** -model.recency_alpha + body) / z_row)
            )
            for k in d
        ],
        color="C3",
        lw=2,
        label="fitted model",
    )
    ax.plot([], [], color="0.6", label="SmolLM2-135M (3 texts)")
    ax.set_xlabel("query-key distance d")
    ax.set_ylabel(f"mean attention (queries {n // 2}..{n - 1})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from kvpolicy.evict.quality import load_smollm2

    lm = load_smollm2()
    sources = texts()
    per_layer_gpl3 = None
    recorded = {}
    for name, text in sources.items():
        layers = record(lm, text, args.tokens)
        recorded[name] = averaged(layers)
        if name == "GPL-3":
            per_layer_gpl3 = layers
    assert per_layer_gpl3 is not None
    mats = list(recorded.values())
    model = fit_attention(np.stack(mats))
    per_text = {name: fit_attention(a).to_dict() for name, a in recorded.items()}
    without_noise = AttentionModel.from_dict({**model.to_dict(), "query_sigma": 0.0})
    synthetic = draws(model, args.tokens, True)
    result = {
        "tokens": args.tokens,
        "model": model.to_dict(),
        "per_text_fit": per_text,
        "summary": {
            "recorded": mean_dicts([attention_summary(a) for a in mats]),
            "synthetic": mean_dicts([attention_summary(a) for a in synthetic]),
        },
        "recall": {
            **{f"recorded:{name}": recall_table(a) for name, a in recorded.items()},
            "synthetic": mean_dicts([recall_table(a) for a in synthetic]),
            "synthetic without query noise": mean_dicts(
                [recall_table(a) for a in draws(without_noise, args.tokens, False)]
            ),
            "recorded:GPL-3 per layer": mean_dicts([recall_table(a) for a in per_layer_gpl3]),
        },
    }
    # The fit without the body's decay, and both against recordings twice as long.
    no_decay = fit_attention(np.stack(mats), heavy_decay=0.0)
    result["fit_without_decay"] = no_decay.to_dict()
    longer = [
        averaged(record(lm, sources[k], 2 * args.tokens)) for k in ("pydoc_data.topics", "GPL-3")
    ]
    result["beyond"] = beyond(longer, {"fit": model, "gamma = 0": no_decay})
    (args.out / "fit.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(args.out / "attention_fit.png", mats, model)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
