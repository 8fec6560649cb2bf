"""Implementations found by name: one resolver for every kvpolicy component.

Each library declares what it implements as entry points in its own ``pyproject.toml``::

    [project.entry-points."kvpolicy.eviction"]
    token-pd = "kvpolicy.evict:TokenPDPolicy"

and any integration builds one from a name and keyword parameters::

    policy = build(EVICTION, "h2o", {"recent_window": 64})

so that an integration never keeps a table of another package's class names, and a policy
added to a library is usable everywhere without editing the integrations.

An entry point names a *factory*: a callable whose keyword parameters are the component's
params. Two conventions cover everything the libraries need:

- a factory whose only parameter is annotated with an attrs class (``TokenPDPolicy(config:
  TokenPDConfig | None = None)``) gets that class built from the params, so the config
  class's validators name a bad field;
- a factory with a keyword-only parameter ``context`` also gets the :class:`ServerContext` of
  the server the component sits in front of or below (a gateway sizes its pool from it, a
  tier store its blocks); ``context`` is never a user param.

Params are checked against the factory's signature before the call: an unknown param, a
missing required one, or a value the factory rejects is a :class:`RegistryError` that names
the group, the implementation and the param.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any, Generic, TypeVar, cast

import attrs
from attrs import field, frozen
from attrs.validators import ge, gt, instance_of

from kvpolicy.kvmodel._entrypoints import (
    ADMISSION_GROUP,
    AUTOSCALING_GROUP,
    EVICTION_GROUP,
    GATEWAY_GROUP,
    PREEMPTION_GROUP,
    ROUTING_GROUP,
    TIERS_GROUP,
    WORKLOAD_FORMATS_GROUP,
    entry_point_names,
    group_entry_points,
)
from kvpolicy.kvmodel._errors import KVModelError
from kvpolicy.kvmodel._protocols import (
    AdmissionPolicy,
    Autoscaler,
    EvictionPolicy,
    PreemptionPolicy,
    PrefixStore,
    RequestGate,
    Router,
)
from kvpolicy.kvmodel._specs import ModelSpec
from kvpolicy.kvmodel._types import Request

__all__ = [
    "ADMISSION",
    "AUTOSCALING",
    "EVICTION",
    "GATEWAY",
    "GROUPS",
    "PREEMPTION",
    "ROUTING",
    "TIERS",
    "WORKLOAD_FORMATS",
    "Group",
    "ParamSpec",
    "RegistryError",
    "RegistryTypeError",
    "ServerContext",
    "build",
    "describe",
    "names",
]

T = TypeVar("T")

_CONTEXT = "context"


class RegistryError(KVModelError, ValueError):
    """An unknown implementation name, or params its factory rejects (both named)."""


class RegistryTypeError(RegistryError, TypeError):
    """A param of the wrong type: a :class:`RegistryError` that is also a ``TypeError``."""


@frozen
class Group(Generic[T]):
    """A kind of component: its entry-point group and the Protocol its implementations meet."""

    entry_point: str = field(validator=instance_of(str))
    """Entry-point group name, e.g. ``kvpolicy.eviction``."""
    kind: str = field(validator=instance_of(str))
    """What one implementation is called in messages, e.g. ``eviction policy``."""
    protocol: type[T] | None = field(default=None)
    """The runtime-checkable Protocol a built component must implement (None: unchecked)."""


ADMISSION: Group[AdmissionPolicy] = Group(ADMISSION_GROUP, "admission policy", AdmissionPolicy)
"""How many waiting requests join each iteration (kvpolicy-admit)."""
EVICTION: Group[EvictionPolicy] = Group(EVICTION_GROUP, "eviction policy", EvictionPolicy)
"""Batch-global token eviction (kvpolicy-evict)."""
PREEMPTION: Group[PreemptionPolicy] = Group(PREEMPTION_GROUP, "preemption policy", PreemptionPolicy)
"""Order of preemption when blocks run out (kvpolicy-evict)."""
GATEWAY: Group[RequestGate] = Group(GATEWAY_GROUP, "gateway", RequestGate)
"""Admission in front of the server, 429 + Retry-After (kvpolicy-tenancy)."""
TIERS: Group[PrefixStore] = Group(TIERS_GROUP, "prefix store", PrefixStore)
"""KV prefix tiers below HBM (kvpolicy-tiers)."""
WORKLOAD_FORMATS: Group[object] = Group(WORKLOAD_FORMATS_GROUP, "trace format")
"""Loaders of public trace formats (the simulator's workloads)."""
ROUTING: Group[Router] = Group(ROUTING_GROUP, "router", Router)
"""Which replica of a fleet serves a request (kvpolicy-admit)."""
AUTOSCALING: Group[Autoscaler] = Group(AUTOSCALING_GROUP, "autoscaler", Autoscaler)
"""How many replicas a fleet should have (kvpolicy-admit, kvpolicy-tenancy)."""

GROUPS: tuple[Group[Any], ...] = (
    ADMISSION,
    EVICTION,
    PREEMPTION,
    GATEWAY,
    TIERS,
    WORKLOAD_FORMATS,
    ROUTING,
    AUTOSCALING,
)
"""Every group, in the order of a serving stack."""


def _requests(value: Iterable[Request]) -> tuple[Request, ...]:
    return tuple(value)


@frozen
class ServerContext:
    """What a gateway or a prefix store needs to know of the server it is built for."""

    model: ModelSpec = field(validator=instance_of(ModelSpec))
    """The served model (KV bytes per token)."""
    block_size: int = field(validator=[instance_of(int), ge(1)])
    """Tokens per paged KV block."""
    kv_capacity_tokens: int = field(validator=[instance_of(int), ge(1)])
    """KV pool size in tokens."""
    max_batch: int = field(validator=[instance_of(int), ge(1)])
    """Most requests running at once."""
    tokens_per_s: float = field(converter=float, validator=gt(0.0))
    """Sustained tokens per second (prompt and output) the server serves at saturation."""
    requests: tuple[Request, ...] = field(default=(), converter=_requests)
    """The workload when it is known in advance (a trace replay), e.g. to fit TTLs on;
    empty for a live server."""


@frozen
class ParamSpec:
    """One param an implementation accepts."""

    name: str
    """Keyword name."""
    default: object
    """Default value; :data:`inspect.Parameter.empty` when the param is required."""
    doc: str = ""
    """The attrs field's docstring when the factory takes a config class, else empty."""

    @property
    def required(self) -> bool:
        """True when the param has no default."""
        return self.default is inspect.Parameter.empty


def names(group: Group[Any]) -> tuple[str, ...]:
    """Names of the installed implementations of ``group``, sorted."""
    return entry_point_names(group.entry_point)


def _load(group: Group[Any], name: str) -> Callable[..., Any]:
    if not isinstance(name, str):
        raise TypeError(f"{group.kind} name must be a str: {name!r}")
    eps = group_entry_points(group.entry_point)
    if name not in eps:
        known = ", ".join(sorted(eps)) or "none installed"
        raise RegistryError(f"unknown {group.kind} {name!r}; known: {known}")
    try:
        factory = eps[name].load()
    except (ImportError, AttributeError) as exc:
        raise RegistryError(
            f"{group.kind} {name!r} is declared by an installed package but cannot be "
            f"loaded ({eps[name].value}): {exc}"
        ) from exc
    if not callable(factory):
        raise RegistryError(f"{group.kind} {name!r}: {eps[name].value} is not callable")
    return cast(Callable[..., Any], factory)


def _config_class(factory: Callable[..., Any]) -> type | None:
    """The attrs class of a factory whose only parameter is its config, else None."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    params = [p for p in sig.parameters.values() if p.name != _CONTEXT]
    if len(params) != 1 or params[0].kind is inspect.Parameter.VAR_KEYWORD:
        return None
    try:
        target = factory.__init__ if inspect.isclass(factory) else factory
        hints = typing.get_type_hints(target)
    except Exception:  # a hint that does not resolve just means: no config class
        return None
    hint = hints.get(params[0].name)
    for arg in (hint, *typing.get_args(hint)):
        if inspect.isclass(arg) and attrs.has(arg):
            return arg
    return None


def _signature_params(
    factory: Callable[..., Any],
) -> tuple[list[ParamSpec], bool, inspect.Parameter | None]:
    """(params, accepts any keyword, its ``context`` parameter) of a plain factory."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return [], True, None
    out: list[ParamSpec] = []
    var_kw = False
    context = None
    for p in sig.parameters.values():
        if p.name == _CONTEXT:
            context = p
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            var_kw = True
        elif p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            out.append(ParamSpec(p.name, p.default))
    return out, var_kw, context


def _attrs_params(cls: type, *, docs: bool = True) -> list[ParamSpec]:
    """The init fields of ``cls``; with ``docs``, each with the docstring under it (read
    from the source, which :func:`build` has no use for)."""
    out = []
    for a in attrs.fields(cls):
        if not a.init:
            continue
        if a.default is attrs.NOTHING:
            default: object = inspect.Parameter.empty
        elif isinstance(a.default, attrs.Factory):  # type: ignore[arg-type]
            default = a.default.factory()
        else:
            default = a.default
        doc = _field_doc(cls, a.name) if docs else ""
        out.append(ParamSpec(a.alias or a.name, default, doc))
    return out


def _field_doc(cls: type, name: str) -> str:
    """The docstring under an attrs field (the string literal that follows it), if any."""
    return _field_docs(cls).get(name, "")


@cache
def _field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under it, read from ``cls``'s source once per class
    (reading and parsing the source is ~50 ms; describe() asks for every field)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    docs: dict[str, str] = {}
    for line, nxt in zip(lines, [*lines[1:], ""], strict=True):
        head = line.strip().split(":", 1)
        if len(head) != 2 or not head[0].isidentifier() or head[0] in docs:
            continue
        nxt = nxt.strip()
        for q in ('"""', "'''"):
            if nxt.startswith(q):
                docs[head[0]] = nxt[3:].split(q)[0].strip()
                break
    return docs


def describe(group: Group[Any], name: str) -> tuple[ParamSpec, ...]:
    """The params ``name`` of ``group`` accepts, with their defaults.

    Raises:
        RegistryError: ``name`` is not installed (the message lists the known names).
    """
    factory = _load(group, name)
    cls = _config_class(factory)
    if cls is not None:
        return tuple(_attrs_params(cls))
    return tuple(_signature_params(factory)[0])


def build(
    group: Group[T],
    name: str,
    params: Mapping[str, object] | None = None,
    *,
    context: ServerContext | None = None,
) -> T:
    """Build implementation ``name`` of ``group`` with keyword ``params``.

    Args:
        group: which kind of component (:data:`EVICTION`, :data:`ADMISSION`, ...).
        name: an entry-point name of that group (see :func:`names`).
        params: keyword parameters of the implementation (None: all defaults).
        context: the server, for implementations that size themselves from it (a gateway,
            a prefix store); required by those, ignored by the rest.

    Returns:
        The built component; it implements ``group.protocol``.

    Raises:
        RegistryError: an unknown name (the known ones are listed), an unknown or missing
            param (named, with the accepted ones), a value the implementation rejects, a
            missing ``context``, or a result that does not implement the group's Protocol.
    """
    if not isinstance(group, Group):
        raise TypeError(f"'group' must be a Group: {group!r}")
    raw = {} if params is None else params
    if not isinstance(raw, Mapping):
        raise TypeError(f"{group.kind} {name!r}: 'params' must be a mapping: {raw!r}")
    for key in raw:
        if not isinstance(key, str):
            raise RegistryError(f"{group.kind} {name!r}: param names must be str: {key!r}")
    factory = _load(group, name)
    where = f"{group.kind} {name!r}"
    cls = _config_class(factory)
    specs = _attrs_params(cls, docs=False) if cls is not None else _signature_params(factory)[0]
    _, var_kw, context_param = _signature_params(factory)
    accepted = [s.name for s in specs]
    if not var_kw or cls is not None:
        for key in raw:
            if key not in accepted:
                listed = ", ".join(accepted) or "no params"
                raise RegistryError(f"{where}: unknown param {key!r}; accepted: {listed}")
    for spec in specs:
        if spec.required and spec.name not in raw:
            raise RegistryError(f"{where}: param {spec.name!r} is required")
    kwargs: dict[str, Any] = {}
    if context_param is not None:
        if context is None and context_param.default is inspect.Parameter.empty:
            raise RegistryError(f"{where} needs the server's context (model, KV pool, rate)")
        if context is not None:
            if not isinstance(context, ServerContext):
                raise TypeError(f"'context' must be a ServerContext: {context!r}")
            kwargs[_CONTEXT] = context
    try:
        obj = factory(cls(**raw), **kwargs) if cls is not None else factory(**raw, **kwargs)
    except RegistryError:
        raise
    except TypeError as exc:
        raise RegistryTypeError(f"{where}: {exc}") from exc
    except (ValueError, KVModelError) as exc:
        raise RegistryError(f"{where}: {exc}") from exc
    if group.protocol is not None and not isinstance(obj, group.protocol):
        raise RegistryError(f"{where} does not implement {group.protocol.__name__}: {obj!r}")
    return cast(T, obj)
