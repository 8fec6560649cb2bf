"""The one resolver: implementations by entry-point name, params checked and named."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from kvpolicy.kvmodel import (
    ADMISSION,
    EVICTION,
    GATEWAY,
    RegistryError,
    Request,
    SchedulerState,
    ServerContext,
    _registry,
    build,
    describe,
    get_model,
    names,
)

PLUGIN = '''
from __future__ import annotations

from attrs import field, frozen
from attrs.validators import ge


class FixedCount:
    """Admits a fixed number of waiting requests each iteration."""

    def __init__(self, count: int = 1, *, context=None) -> None:
        if count < 0:
            raise ValueError(f"'count' must be >= 0: {count!r}")
        self.count = count
        self.context = context

    def admit(self, state, waiting) -> int:
        return min(self.count, len(waiting))


@frozen
class HoldConfig:
    limit: int = field(default=4, validator=ge(0))
    """How many requests may be held."""


class Hold:
    def __init__(self, config: HoldConfig | None = None) -> None:
        self.config = config or HoldConfig()

    def admit(self, state, waiting) -> int:
        return min(self.config.limit, len(waiting))


class NotAPolicy:
    pass


def needs_context(*, context):
    return FixedCount(context.max_batch)


def needs_window(window: int):
    return FixedCount(window)
'''

ENTRY_POINTS = """
[kvpolicy.admission]
fixed = kvtestplugin:FixedCount
hold = kvtestplugin:Hold
broken = kvtestplugin:NotAPolicy
missing = kvtestplugin:DoesNotExist
sized = kvtestplugin:needs_context
windowed = kvtestplugin:needs_window
"""


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[None]:
    """A real installed distribution (a dist-info on sys.path) declaring admission policies."""
    (tmp_path / "kvtestplugin.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "kvtestplugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvtestplugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    sys.path.insert(0, str(tmp_path))
    _registry.group_entry_points.cache_clear()
    try:
        yield
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("kvtestplugin", None)
        _registry.group_entry_points.cache_clear()


def _state() -> SchedulerState:
    return SchedulerState(step=0, time=0.0, used_tokens=0, capacity_tokens=100, running=())


def _waiting(n: int) -> Sequence[Request]:
    return [Request(f"r{i}", prompt_len=4, decode_len=2) for i in range(n)]


def _context() -> ServerContext:
    return ServerContext(
        model=get_model("Llama-3-8B"),
        block_size=16,
        kv_capacity_tokens=1024,
        max_batch=7,
        tokens_per_s=1000.0,
    )


@pytest.mark.usefixtures("plugin")
class TestBuild:
    def test_names_lists_the_installed_implementations(self) -> None:
        """names() lists every entry point of the group, sorted."""
        assert {"broken", "fixed", "hold", "missing", "sized", "windowed"} <= set(names(ADMISSION))

    def test_builds_with_params(self) -> None:
        """A factory's keyword params are passed through and the result works."""
        policy = build(ADMISSION, "fixed", {"count": 3})
        assert policy.admit(_state(), _waiting(5)) == 3

    def test_defaults_when_no_params(self) -> None:
        """With no params every default applies."""
        assert build(ADMISSION, "fixed").admit(_state(), _waiting(5)) == 1

    def test_unknown_name_lists_known(self) -> None:
        """An unknown name is an error that lists the installed ones."""
        with pytest.raises(RegistryError, match=r"unknown admission policy 'nope'; known: .*fixed"):
            build(ADMISSION, "nope")

    def test_unknown_param_is_named_with_accepted(self) -> None:
        """A param the factory does not take is named, with the accepted ones."""
        with pytest.raises(RegistryError, match=r"unknown param 'cnt'; accepted: count"):
            build(ADMISSION, "fixed", {"cnt": 3})

    def test_missing_required_param_is_named(self) -> None:
        """A required param left out is named, not reported as a TypeError of the call."""
        with pytest.raises(RegistryError, match=r"'windowed': param 'window' is required"):
            build(ADMISSION, "windowed")

    def test_rejected_value_names_the_implementation(self) -> None:
        """A value the factory rejects keeps its message and gains the group and name."""
        with pytest.raises(RegistryError, match=r"admission policy 'fixed': 'count' must be >= 0"):
            build(ADMISSION, "fixed", {"count": -1})

    def test_config_class_convention(self) -> None:
        """A factory taking one attrs config gets it built from the params, validated."""
        assert build(ADMISSION, "hold", {"limit": 2}).admit(_state(), _waiting(5)) == 2
        with pytest.raises(RegistryError, match=r"'limit' must be >= 0"):
            build(ADMISSION, "hold", {"limit": -1})
        with pytest.raises(RegistryError, match=r"unknown param 'limt'; accepted: limit"):
            build(ADMISSION, "hold", {"limt": 1})

    def test_describe_lists_params_and_defaults(self) -> None:
        """describe() gives each param's default and, for a config class, its docstring."""
        (limit,) = describe(ADMISSION, "hold")
        assert (limit.name, limit.default, limit.required) == ("limit", 4, False)
        assert limit.doc == "How many requests may be held."
        (window,) = describe(ADMISSION, "windowed")
        assert window.required

    def test_result_must_implement_the_protocol(self) -> None:
        """A factory whose result is not an AdmissionPolicy is refused."""
        with pytest.raises(RegistryError, match="does not implement AdmissionPolicy"):
            build(ADMISSION, "broken")

    def test_unloadable_entry_point(self) -> None:
        """An entry point whose target is gone says which one."""
        with pytest.raises(RegistryError, match=r"'missing' .* cannot be loaded"):
            build(ADMISSION, "missing")

    def test_context_passed_to_those_that_take_it(self) -> None:
        """A factory with a ``context`` keyword gets the server context; it is not a param."""
        policy = build(ADMISSION, "sized", context=_context())
        assert policy.admit(_state(), _waiting(10)) == 7
        with pytest.raises(RegistryError, match="needs the server's context"):
            build(ADMISSION, "sized")
        with pytest.raises(RegistryError, match="unknown param 'context'"):
            build(ADMISSION, "sized", {"context": 1})

    def test_non_mapping_params(self) -> None:
        """params must be a mapping."""
        with pytest.raises(TypeError, match="'params' must be a mapping"):
            build(ADMISSION, "fixed", [1])  # type: ignore[arg-type]


class TestGroups:
    def test_group_without_implementations(self) -> None:
        """A group nothing installs says so instead of listing nothing."""
        _registry.group_entry_points.cache_clear()
        if names(GATEWAY):
            pytest.skip("a gateway is installed in this environment")
        with pytest.raises(RegistryError, match="known: none installed"):
            build(GATEWAY, "token-pool")

    def test_groups_name_their_entry_point_group(self) -> None:
        """Each group is the entry-point group libraries declare."""
        assert EVICTION.entry_point == "kvpolicy.eviction"
        assert ADMISSION.protocol is not None

    def test_server_context_validates(self) -> None:
        """ServerContext rejects a pool of no tokens, naming the field."""
        with pytest.raises(ValueError, match="'kv_capacity_tokens' must be >= 1"):
            ServerContext(
                model=get_model("Llama-3-8B"),
                block_size=16,
                kv_capacity_tokens=0,
                max_batch=1,
                tokens_per_s=1.0,
            )
