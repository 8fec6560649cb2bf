"""The kernels compute what kvpolicy-evict computes (skipped where evict is not installed)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from kvpolicy.kernels import CompactWeights, MLPWeights, ScoreParams, score_tokens, select_evictions

evict = pytest.importorskip("kvpolicy.evict", reason="kvpolicy-evict is not installed")
predictors = pytest.importorskip("kvpolicy.evict.predictors")


class TestMatchesEvictPredictors:
    def test_mlp_matches_logits_mlp_predictor(self, device: torch.device) -> None:
        """fp32 logits: R_hat of the kernel equals LogitsMLPPredictor's within 1e-5."""
        torch.manual_seed(1)
        v = 300
        net = torch.nn.Sequential(
            torch.nn.Linear(v, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1), torch.nn.Sigmoid()
        )
        pred = predictors.LogitsMLPPredictor(net, risk=0.01)
        weights = MLPWeights(
            net[0].weight, net[0].bias, net[2].weight[0], float(net[2].bias.detach()), 0.01
        )
        z = torch.randn(9, v) * 3
        want = pred.predict_logits(z)
        got = score_tokens(z.to(device), weights, ScoreParams(), backend="triton")
        torch.testing.assert_close(got.returns.cpu(), want, atol=1e-5, rtol=1e-5)
        assert got.risks.cpu().tolist() == pytest.approx([0.01] * 9)

    def test_compact_matches_compact_predictor(self, device: torch.device) -> None:
        """R_hat and sigma^2 equal CompactReturnPredictor.predict on compact_features."""
        pred = predictors.default_compact()
        z = torch.randn(11, 500) * 2
        pos = torch.arange(11) * 37
        att = torch.rand(11) * 0.2
        r, v = pred.predict(
            predictors.compact_features(z.double().numpy(), pos.numpy(), att.numpy())
        )
        got = score_tokens(
            z.to(device),
            CompactWeights(pred.weights, pred.residual_variance),
            ScoreParams(),
            positions=pos.to(device),
            attention=att.to(device),
            backend="triton",
        )
        np.testing.assert_allclose(got.returns.cpu().numpy(), r, atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(got.risks.cpu().numpy(), v, atol=1e-5, rtol=1e-4)


class TestMatchesTokenPD:
    @pytest.mark.parametrize("budget", [0, 10, 40, 75, 120])
    def test_selection_equals_token_pd_evict(
        self, budget: int, device: torch.device, make_logits: Callable[..., torch.Tensor]
    ) -> None:
        """Same evicted tokens as TokenPDPolicy.evict, many ties across three streams."""
        cfg = evict.TokenPDConfig(risk_aversion=0.5, initial_price=0.25, token_cost=1.0)
        policy = evict.TokenPDPolicy(cfg)
        rng = np.random.default_rng(budget)
        order: list[tuple[str, int]] = []  # index in g -> (stream, position): insertion order
        g_rows: list[float] = []
        for step in range(25):
            for s in ("a", "b", "c"):
                r = float(rng.integers(0, 8)) / 8.0
                var = float(rng.integers(0, 2)) / 4.0
                policy.insert(s, np.array([step]), np.array([[r, var]]))
                order.append((s, step))
                g_rows.append(r - 0.5 * var - 0.25)
        g = torch.tensor(g_rows, dtype=torch.float32, device=device)
        got = select_evictions(g, budget, backend="triton")
        want = policy.evict(budget)
        picked: dict[str, list[int]] = {}
        for i in got.indices.cpu().tolist():
            s, pos = order[i]
            picked.setdefault(s, []).append(pos)
        assert picked == {s: p.tolist() for s, p in want.items()}
        assert got.demand == policy.last_demand


class TestEvictUsesKernels:
    def test_insert_logits_matches_insert_with_predicted_signals(self) -> None:
        """TokenPDPolicy.insert_logits on CPU logits = insert with the predictor's signals."""
        pred = predictors.default_compact()
        z = torch.randn(6, 200)
        pos = np.arange(6, dtype=np.int64)
        att = np.linspace(0.0, 0.3, 6)
        a = evict.TokenPDPolicy()
        a.insert_logits("s", pos, z, pred, attention=att)
        b = evict.TokenPDPolicy()
        r, v = pred.predict(predictors.compact_features(z.numpy(), pos, att))
        b.insert("s", pos, np.column_stack((r, v)))
        np.testing.assert_allclose(a.estimates("s", pos), b.estimates("s", pos), rtol=1e-12)

    @pytest.mark.gpu
    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    def test_cuda_logits_take_the_kernel(self) -> None:
        """CUDA logits: the fused kernel's signals agree with the CPU path's."""
        pred = predictors.default_compact()
        z = torch.randn(64, 49_152, dtype=torch.bfloat16)
        pos = np.arange(64, dtype=np.int64)
        att = np.full(64, 0.01)
        cpu = pred.predict_logits(z, pos, att)
        gpu = pred.predict_logits(z.cuda(), pos, att)
        np.testing.assert_allclose(gpu[0], cpu[0], atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(gpu[1], cpu[1], atol=1e-5, rtol=1e-4)

    @pytest.mark.gpu
    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    def test_cuda_mlp_takes_the_kernel(self) -> None:
        """LogitsMLPPredictor.predict_logits on CUDA fp32 logits agrees with its CPU path."""
        v = 49_152
        net = torch.nn.Sequential(
            torch.nn.Linear(v, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1), torch.nn.Sigmoid()
        )
        pred = predictors.LogitsMLPPredictor(net, risk=0.02)
        z = torch.randn(64, v) * 2
        cpu = pred.predict_logits(z)
        net.cuda()
        gpu = pred.predict_logits(z.cuda())
        torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=1e-3)
