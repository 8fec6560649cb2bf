"""The gateway's backends and routing settings: parsed, checked, errors naming the field."""

from __future__ import annotations

import pytest

from kvpolicy.kvmodel import ROUTING, names
from kvpolicy.tenancy import ManifestError
from kvpolicy.tenancy._backends import (
    BackendSpec,
    build_autoscaler,
    build_router,
    load_backends,
    load_routing,
)
from kvpolicy.tenancy._entitlements import Resources, TokenPool
from kvpolicy.tenancy._health import HealthConfig


class TestLoadBackends:
    def test_flags_then_manifest(self) -> None:
        """Flags come first, then the manifest's list with its weights and labels."""
        got = load_backends(
            ["http://a:8000/"],
            {"backends": [{"url": "https://b:9000", "weight": 2, "model": "m", "gpu": "H100"}]},
        )
        assert got == (
            BackendSpec("http://a:8000"),
            BackendSpec("https://b:9000", 2.0, "m", "H100"),
        )

    @pytest.mark.parametrize(
        ("urls", "manifest", "match"),
        [
            (["ftp://a"], None, r"'--backend' must be an http:// or https:// URL.*'ftp://a'"),
            (["http://"], None, r"'--backend' must be an http:// or https:// URL"),
            (["http://a:x"], None, r"'--backend' is not a URL"),
            ([], {"backends": [{"url": "unix:/s"}]}, r"backends\[0\]\.url must be an http"),
            ([], {"backends": [{"weight": 1}]}, r"backends\[0\]: missing key 'url'"),
            ([], {"backends": [{"url": "http://a", "w": 1}]}, r"backends\[0\]: unknown key 'w'"),
            (
                [],
                {"backends": [{"url": "http://a", "weight": 0}]},
                r"'weight' must be finite and > 0: 0",
            ),
            (
                [],
                {"backends": [{"url": "http://a", "weight": "2"}]},
                r"backends\[0\]\.weight must be a number",
            ),
            (
                [],
                {"backends": [{"url": "http://a", "gpu": 3}]},
                r"backends\[0\]\.gpu must be a string: 3",
            ),
            ([], {"backends": "http://a"}, r"backends must be a list"),
            ([], None, r"no backend: give '--backend URL' or a 'backends:' list"),
            ([], {"backends": []}, r"no backend"),
            (["http://A:80", "http://a"], None, r"backend 'http://a' is given twice"),
            (
                ["http://a:8000"],
                {"backends": ["http://a:8000/"]},
                r"'http://a:8000' is given twice",
            ),
        ],
    )
    def test_bad_input_names_the_flag_or_field(
        self, urls: list[str], manifest: dict[str, object] | None, match: str
    ) -> None:
        """Each bad backend is a ManifestError naming the flag or field and the value."""
        with pytest.raises(ManifestError, match=match):
            load_backends(urls, manifest)


class TestRouting:
    def test_defaults_and_the_flag_wins(self) -> None:
        """The section is read; --router replaces its router and drops its params."""
        m = {"routing": {"router": "weighted", "params": {"x": 1}, "health": {"interval_s": 0}}}
        cfg = load_routing(m)
        assert (cfg.router, dict(cfg.params), cfg.health) == (
            "weighted",
            {"x": 1},
            HealthConfig(interval_s=0.0),
        )
        cfg = load_routing(m, "round-robin")
        assert (cfg.router, dict(cfg.params)) == ("round-robin", {})
        assert load_routing(None).router == "least-requests"

    @pytest.mark.parametrize(
        ("section", "match"),
        [
            ({"routr": "x"}, r"routing: unknown key 'routr'"),
            ({"health": {"intervl": 1}}, r"routing.health: unknown key 'intervl'"),
            ({"health": {"backoff_s": 5, "max_backoff_s": 1}}, r"'max_backoff_s' must be >="),
            ({"max_signal_age_s": 0}, r"routing: 'max_signal_age_s' must be > 0"),
            ({"block_chars": 0}, r"routing: 'block_chars' must be >= 1"),
            ("fast", r"routing must be a mapping"),
        ],
    )
    def test_bad_settings(self, section: object, match: str) -> None:
        """A bad routing setting names its path."""
        with pytest.raises(ManifestError, match=match):
            load_routing({"routing": section})

    def test_unknown_router_lists_the_known_ones(self) -> None:
        """An unknown router names the flag and lists what is installed."""
        with pytest.raises(ManifestError, match=r"--router.*unknown router 'nope'; known: ") as e:
            build_router(load_routing(None, "nope"))
        for name in names(ROUTING):
            assert name in str(e.value)


class TestAutoscaler:
    def test_none_unless_named(self) -> None:
        """No section and no flag: no autoscaler."""
        pool = TokenPool("p", Resources(100, 1000, 8), [])
        assert build_autoscaler({}, None, pool, 2) is None

    def test_token_pool_sized_per_backend(self) -> None:
        """token-pool gets the pool, each replica a backend's share of its capacity."""
        pool = TokenPool("p", Resources(100, 1000, 8), [])
        scaler = build_autoscaler({"autoscaling": {"autoscaler": "token-pool"}}, None, pool, 4)
        assert scaler is not None
        assert scaler.replica == Resources(25, 250, 2)  # type: ignore[attr-defined]

    def test_unknown_autoscaler(self) -> None:
        """An unknown name names the flag; an unknown key names the section."""
        pool = TokenPool("p", Resources(100, 1000, 8), [])
        with pytest.raises(ManifestError, match=r"--autoscaler.*unknown autoscaler 'up'"):
            build_autoscaler({}, "up", pool, 1)
        with pytest.raises(ManifestError, match=r"autoscaling: unknown key 'scaler'"):
            build_autoscaler({"autoscaling": {"scaler": "x"}}, None, pool, 1)
