"""The fused scoring kernel against the torch reference, and the input checks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvpolicy.kernels import (
    TOLERANCES,
    Backend,
    CompactWeights,
    MLPWeights,
    ScoreParams,
    score_tokens,
    select_evictions,
)

LogitsFactory = Callable[[int, int, torch.dtype, torch.device], torch.Tensor]
MLPFactory = Callable[..., MLPWeights]

PARAMS = ScoreParams(risk_aversion=0.3, recompute_penalty=0.05, token_cost=2.0, price=0.1)
SHAPES = [(5, 123), (17, 1000), (1, 64)]


def _close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> None:
    torch.testing.assert_close(a.cpu(), b.cpu(), atol=atol, rtol=rtol)


class TestScoreMLP:
    @pytest.mark.parametrize(("dtype", "atol", "rtol"), list(TOLERANCES))
    @pytest.mark.parametrize(("b", "v"), SHAPES)
    def test_triton_matches_reference(
        self,
        dtype: torch.dtype,
        atol: float,
        rtol: float,
        b: int,
        v: int,
        device: torch.device,
        make_logits: LogitsFactory,
        make_mlp: MLPFactory,
        compact: CompactWeights,
    ) -> None:
        """R, sigma^2 and g of the Triton kernel equal the torch reference's."""
        z = make_logits(b, v, dtype, device)
        mlp = make_mlp(v)
        got = score_tokens(z, mlp, PARAMS, backend="triton")
        want = score_tokens(z.cpu(), mlp, PARAMS, backend="torch")
        for g, w in zip(got, want, strict=True):
            assert g.dtype == torch.float32
            assert g.shape == (b,)
            _close(g, w, atol, rtol)

    def test_hidden_256_as_in_the_paper(
        self, device: torch.device, make_logits: LogitsFactory, make_mlp: MLPFactory
    ) -> None:
        """The paper's width (V -> 256 -> 1) on a batch that is not a block multiple."""
        z = make_logits(19, 200, torch.float16, device)
        mlp = make_mlp(200, hidden=256)
        got = score_tokens(z, mlp, PARAMS, backend="triton")
        want = score_tokens(z.cpu(), mlp, PARAMS, backend="torch")
        _close(got.excess, want.excess, 2e-5, 1e-4)

    @pytest.mark.parametrize("hidden", [256, 512])
    def test_many_slices_merged_in_chunks(
        self,
        hidden: int,
        device: torch.device,
        make_logits: LogitsFactory,
        make_mlp: MLPFactory,
        compact: CompactWeights,
    ) -> None:
        """125 vocabulary slices: the merging pass reads the MLP partials in several chunks
        (32 slices a load at H = 256, 16 at 512) and every slice's statistics at once. A
        row whose mass is all in the first slices, and a row with a NaN in a late slice
        (NaN out, the other rows unaffected)."""
        from kvpolicy.kernels._triton import (
            ScoreLaunch,
            finish_tiles,
            score_tokens_triton,
            vocab_slices,
        )

        launch = ScoreLaunch(16, 16, 200, 4)
        _cols, splits = vocab_slices(2000, launch)
        s_pad, s_chunk = finish_tiles(splits, hidden)
        assert (splits, s_pad) == (125, 128)
        assert s_chunk < splits
        z = make_logits(4, 2000, torch.float32, device)
        z[1, 40:] = -1e4
        z[2, 1990] = float("nan")
        mlp = make_mlp(2000, hidden=hidden)
        pos = torch.arange(4, device=device)
        att = torch.full((4,), 0.02, device=device)
        interpret = device.type == "cpu"
        for predictor in (mlp, compact):
            got = score_tokens_triton(
                z, predictor, PARAMS, pos, att, interpret=interpret, launch=launch
            )
            extra = {} if predictor is mlp else {"positions": pos.cpu(), "attention": att.cpu()}
            want = score_tokens(z.cpu(), predictor, PARAMS, backend="torch", **extra)
            for g, w in zip(got, want, strict=True):
                assert bool(torch.isnan(g[2]))
                _close(g[[0, 1, 3]], w[[0, 1, 3]], 1e-5, 1e-5)

    @pytest.mark.heavy  # 37 x 49,152 through Triton's interpreter: ~5 s of CPU
    def test_large_vocabulary(
        self, device: torch.device, make_logits: LogitsFactory, make_mlp: MLPFactory
    ) -> None:
        """37 x 49,152 bf16 (SmolLM2's vocabulary): many vocabulary slices merged."""
        z = make_logits(37, 49_152, torch.bfloat16, device)
        mlp = make_mlp(49_152)
        got = score_tokens(z, mlp, PARAMS, backend="triton")
        want = score_tokens(z.cpu(), mlp, PARAMS, backend="torch")
        _close(got.returns, want.returns, 2e-5, 1e-4)


class TestScoreCompact:
    @pytest.mark.parametrize(("dtype", "atol", "rtol"), list(TOLERANCES))
    @pytest.mark.parametrize(("b", "v"), [*SHAPES, (37, 49_152)])
    def test_triton_matches_reference(
        self,
        dtype: torch.dtype,
        atol: float,
        rtol: float,
        b: int,
        v: int,
        device: torch.device,
        make_logits: LogitsFactory,
        make_mlp: MLPFactory,
        compact: CompactWeights,
    ) -> None:
        """Entropy/top-prob statistics and the log-linear model match the reference."""
        z = make_logits(b, v, dtype, device)
        pos = torch.randint(0, 4000, (b,))
        pos[0] = 0
        att = torch.rand(b) * 0.1
        cw = compact
        got = score_tokens(
            z, cw, PARAMS, positions=pos.to(device), attention=att.to(device), backend="triton"
        )
        want = score_tokens(z.cpu(), cw, PARAMS, positions=pos, attention=att, backend="torch")
        for g, w in zip(got, want, strict=True):
            _close(g, w, atol, rtol)

    def test_excess_formula(
        self, make_logits: LogitsFactory, make_mlp: MLPFactory, compact: CompactWeights
    ) -> None:
        """g = R - lambda sigma^2 + delta - mu c, exactly as evict's excess_value."""
        z = make_logits(4, 50, torch.float32, torch.device("cpu"))
        out = score_tokens(z, compact, PARAMS, positions=torch.arange(4), attention=torch.rand(4))
        want = out.returns - 0.3 * out.risks + 0.05 - 0.1 * 2.0
        torch.testing.assert_close(out.excess, want)


class TestScoreInputs:
    @pytest.mark.parametrize("backend", ["torch", "triton"])
    @pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
    def test_non_finite_rows_come_out_nan(
        self,
        backend: Backend,
        bad: float,
        device: torch.device,
        make_logits: LogitsFactory,
        make_mlp: MLPFactory,
        compact: CompactWeights,
    ) -> None:
        """A NaN/inf logit or attention makes its row NaN; the other rows are untouched."""
        dev = device if backend == "triton" else torch.device("cpu")
        z = make_logits(4, 300, torch.float16, dev)
        mlp = make_mlp(300)
        clean = score_tokens(z, mlp, PARAMS, backend=backend)
        z[1, 250] = bad
        got = score_tokens(z, mlp, PARAMS, backend=backend)
        att = torch.full((4,), 0.01, device=dev)
        att[2] = bad
        pos = torch.arange(4, device=dev)
        got_c = score_tokens(z, compact, PARAMS, positions=pos, attention=att, backend=backend)
        for out in got:
            assert out.isnan().cpu().tolist() == [False, True, False, False]
        for out in got_c:
            assert out.isnan().cpu().tolist() == [False, True, True, False]
        torch.testing.assert_close(got.excess[[0, 2, 3]], clean.excess[[0, 2, 3]])
        with pytest.raises(ValueError, match="NaN"):
            select_evictions(got.excess, 2)

    def test_rejects_unsupported_dtype(
        self, make_logits: LogitsFactory, make_mlp: MLPFactory, compact: CompactWeights
    ) -> None:
        """float64 logits are not a kernel dtype."""
        with pytest.raises(TypeError, match="dtype"):
            score_tokens(torch.zeros(2, 20, dtype=torch.float64), make_mlp(20), PARAMS)

    def test_rejects_vocabulary_mismatch(
        self, make_logits: LogitsFactory, make_mlp: MLPFactory, compact: CompactWeights
    ) -> None:
        """Logits wider than the MLP's input name both widths."""
        with pytest.raises(ValueError, match="V=21, the MLP reads 20"):
            score_tokens(torch.zeros(2, 21), make_mlp(20), PARAMS)

    def test_rejects_non_contiguous_rows(
        self, make_logits: LogitsFactory, make_mlp: MLPFactory, compact: CompactWeights
    ) -> None:
        """A transposed view would make the kernel stride across rows."""
        z = torch.zeros(20, 3).t()
        with pytest.raises(ValueError, match="contiguous"):
            score_tokens(z, make_mlp(20), PARAMS)

    def test_rejects_missing_or_short_features(
        self, make_logits: LogitsFactory, make_mlp: MLPFactory, compact: CompactWeights
    ) -> None:
        """The compact predictor needs (B,) positions and attention."""
        z = torch.zeros(3, 20)
        with pytest.raises(TypeError, match="'positions'"):
            score_tokens(z, compact, PARAMS)
        with pytest.raises(ValueError, match=r"\(3,\)"):
            score_tokens(z, compact, PARAMS, positions=torch.arange(2), attention=torch.zeros(3))
        with pytest.raises(TypeError, match="int32 or int64"):
            score_tokens(z, compact, PARAMS, positions=torch.zeros(3), attention=torch.zeros(3))

    def test_rejects_device_mismatch(
        self, make_logits: LogitsFactory, make_mlp: MLPFactory, compact: CompactWeights
    ) -> None:
        """Features on another device than the logits raise."""
        z = torch.zeros(3, 20)
        with pytest.raises(ValueError, match="'positions' is on meta"):
            score_tokens(
                z,
                compact,
                PARAMS,
                positions=torch.arange(3, device="meta"),
                attention=torch.zeros(3),
            )

    def test_rejects_unknown_backend_and_predictor(
        self, make_logits: LogitsFactory, make_mlp: MLPFactory, compact: CompactWeights
    ) -> None:
        """Unknown names and objects are refused with the bad value."""
        with pytest.raises(ValueError, match="'cuda'"):
            score_tokens(torch.zeros(1, 20), make_mlp(20), PARAMS, backend="cuda")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="predictor"):
            score_tokens(torch.zeros(1, 20), object(), PARAMS)  # type: ignore[arg-type]

    def test_params_are_validated(
        self, make_logits: LogitsFactory, make_mlp: MLPFactory, compact: CompactWeights
    ) -> None:
        """A negative price or a NaN weight is refused when built."""
        with pytest.raises(ValueError, match="price"):
            ScoreParams(price=-1.0)
        with pytest.raises(ValueError, match="finite"):
            CompactWeights((float("nan"),) * 7)
