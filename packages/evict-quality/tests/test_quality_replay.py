"""Replaying a recorded attention through policies (``quality.replay``), on attention built
by hand: the attention lost is what the evicted tokens would have received."""

from __future__ import annotations

import numpy as np
import pytest

from kvpolicy.evict.quality._eval import policy_factory
from kvpolicy.evict.quality.oracle import FutureAttentionOracle
from kvpolicy.evict.quality.replay import main, replay

N = 24
B = 6


def uniform(layers: int = 2, n: int = N) -> np.ndarray:
    """Each query attends equally to every key up to itself."""
    att = np.tril(np.ones((n, n)))
    att /= att.sum(axis=1, keepdims=True)
    return np.repeat(att[None], layers, axis=0)


def sink_and_self(n: int = N) -> np.ndarray:
    """Each query gives half its attention to token 0 and half to itself."""
    att = np.eye(n) * 0.5
    att[:, 0] += 0.5
    return att[None]


def test_uniform_attention_loses_what_the_budget_leaves_out() -> None:
    # Whatever a policy keeps, query t sees B + 1 of its t + 1 keys once t > B.
    expected = sum(1 - (B + 1) / (t + 1) for t in range(B + 1, N)) / N
    for label in ("sink-window", "fifo", "h2o", "token-pd"):
        factory = policy_factory(label)
        assert factory is not None
        result = replay(uniform(), lambda f=factory: f(B), B)
        assert result.lost == pytest.approx(expected), label
        assert result.lost_by_layer.shape == (2,)
        assert result.max_resident == B


def test_a_sink_kept_loses_nothing_a_sink_dropped_loses_half() -> None:
    window = policy_factory("sink-window")
    fifo = policy_factory("fifo")
    assert window is not None
    assert fifo is not None
    assert replay(sink_and_self(), lambda: window(B), B).lost == pytest.approx(0.0)
    # FIFO drops token 0 at step B; every later query loses the half it gives token 0.
    lost = replay(sink_and_self(), lambda: fifo(B), B).lost
    assert lost == pytest.approx(0.5 * (N - B - 1) / N)


def test_oracle_with_the_whole_future_keeps_the_sink() -> None:
    att = sink_and_self()
    cum = np.zeros((1, N + 1, N), dtype=np.float32)
    np.cumsum(att, axis=1, out=cum[:, 1:])
    assert replay(att, lambda: FutureAttentionOracle(cum, N), B).lost == pytest.approx(0.0)


def test_bad_input_names_the_field() -> None:
    window = policy_factory("sink-window")
    assert window is not None
    with pytest.raises(ValueError, match=r"'attention' must be \(layers, n, n\).*\(4, 4\)"):
        replay(np.eye(4), lambda: window(2), 2)
    bad = uniform()
    bad[1, 5, 0] += 0.5
    with pytest.raises(ValueError, match=r"'attention' row \[1, 5\] must sum to 1, sums to 1.5"):
        replay(bad, lambda: window(2), 2)
    with pytest.raises(ValueError, match="'budget' must be an int >= 1: 0"):
        replay(uniform(), lambda: window(2), 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "full", "--out", "x"], "--policy 'full'"),
        (["--text", "poems"], "--text: unknown 'poems'"),
        (["--budget", "0"], "--budget"),
        (["--tokens", "1"], "--tokens must be >= 2: 1"),
    ],
)
def test_command_line_rejects_bad_arguments_before_loading_the_model(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
