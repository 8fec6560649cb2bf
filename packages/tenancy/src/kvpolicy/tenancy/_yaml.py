"""The safe YAML loader of manifests: PyYAML's safe loader's objects, with aliases and
duplicate keys refused, at a cost that lets a manifest of 100,000 entitlements load in
well under 2 s.

Three paths build the same objects, the first that can take a document does:

1. :func:`_block`: the block style people and ``yaml.dump`` write (mappings and sequences by
   indentation, one scalar per line: plain, quoted, ``[]`` or ``{}``; comments), read line by
   line in Python. Each distinct line is parsed once by a regular expression; what a line
   holds is typed by the safe loader's own resolver. Anything else (a tab, a flow
   collection, a block scalar, a multi-line scalar, an anchor, a tag, a duplicate key, odd
   indentation, a character outside printable ASCII) is left to the next path, which takes
   every document.
2. :func:`_from_events`: the objects built straight from libyaml's parser events.
3. :func:`_load_yaml_safely`: PyYAML's safe constructor (explicit tags, merge keys, several
   documents, or no libyaml).

The first path exists because PyYAML cannot go faster than its event objects: merely
iterating libyaml's events costs about 2.5 times the 2 s goal at 100,000 entitlements,
while libyaml itself parses the text in an eighth of that (see the README).
"""

from __future__ import annotations

import contextlib
import gc
import re
from collections.abc import Callable, Iterator
from typing import Any

from kvpolicy.tenancy._entitlements import _short
from kvpolicy.tenancy._errors import ManifestError

__all__ = ["load_yaml", "paused_gc"]


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection inside: building a large manifest's objects (millions,
    none in a cycle) triggers collections whose passes over the growing heap cost about a
    quarter of the load."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_yaml(text: str, name: str = "<yaml>") -> Any:
    """Parse YAML ``text`` (``name``: where it came from, for errors) as PyYAML's safe
    loader would, refusing aliases (an alias bomb expands exponentially, and rendering it in
    an error takes gigabytes) and duplicate keys (which YAML resolves silently, the last
    winning).

    A document in plain block style is read line by line, other documents from libyaml's
    parser events (PyYAML's ``CSafeLoader``), each scalar typed by the safe loader's own
    resolver and constructors: PyYAML's composer and constructor take about 30 times as
    long (100,000 entitlements: see the README). A document that uses what those paths do
    not build themselves (explicit tags, merge keys, several documents, or no libyaml) goes
    through PyYAML's safe constructor with the same rules.

    Raises:
        ManifestError: PyYAML is missing, the text is not YAML, or it has an alias or a
            duplicate key (named with its line); the message never renders the document.
    """
    try:
        import yaml
    except ImportError as err:
        raise ManifestError(
            "YAML needs PyYAML: pip install --find-links dist 'kvpolicy-tenancy[yaml]'"
        ) from err
    try:
        plain = _typer(yaml)
        try:
            with paused_gc():
                return _block(text, plain)
        except _UnusualError:
            pass
        if hasattr(yaml, "CSafeLoader"):
            try:
                return _from_events(yaml, text, name, plain)
            except _UnusualError:
                pass
        return _load_yaml_safely(yaml, text, name)
    except yaml.YAMLError as err:
        raise ManifestError(f"manifest {name!r} is not YAML: {_short(str(err))}") from err


class _UnusualError(Exception):
    """The document needs a more general path (see the module docstring)."""


_PLAIN_INT = re.compile(r"-?[1-9][0-9]*|0")


def _typer(yaml: Any) -> Callable[[str], Any]:
    """``plain(value)``: the object of the plain (unquoted) scalar ``value``, typed as the
    safe loader types it; raises :class:`_UnusualError` for merge keys and ``=``. Values up to
    64 characters are remembered (the same keys and numbers recur on every entitlement)."""
    resolver = yaml.resolver.Resolver()
    constructor = yaml.constructor.SafeConstructor()
    constructors = constructor.yaml_constructors
    scalar_node = yaml.ScalarNode
    str_tag = "tag:yaml.org,2002:str"
    special = ("tag:yaml.org,2002:merge", "tag:yaml.org,2002:value")
    typed: dict[str, Any] = {}
    # The resolver's implicit rules by first character, as its resolve() tries them.
    rules = resolver.yaml_implicit_resolvers
    wildcard = tuple(rules.get(None, ()))
    by_first: dict[str, tuple[tuple[str, re.Pattern[str]], ...]] = {}

    def resolve(value: str) -> str:
        first = value[:1]
        tried = by_first.get(first)
        if tried is None:
            tried = by_first[first] = (*rules.get(first, ()), *wildcard)
        for tag, rule in tried:
            if rule.match(value):
                return str(tag)
        return str_tag

    def plain(value: str) -> Any:
        obj = typed.get(value, typed)
        if obj is not typed:
            return obj
        if _PLAIN_INT.fullmatch(value):
            obj = int(value)
        else:
            tag = resolve(value)
            if tag == str_tag:
                obj = value
            elif tag in special or tag not in constructors:
                raise _UnusualError
            else:
                obj = constructors[tag](constructor, scalar_node(tag, value))
        if len(typed) < 4096 and len(value) <= 64:  # immutable scalars only
            typed[value] = obj
        return obj

    return plain


# -- 1. block style, line by line ----------------------------------------------------------

# A plain scalar of one line: no indicator first (a '-' only before a digit or '.', a '.'
# only before a letter or digit: '...' ends a document), none of ': ', ' #', quotes, flow
# characters or tabs inside; single spaces between words.
_CHARS = r"[A-Za-z0-9_./+~()=$^;@-]"
_PLAIN = rf"(?:[A-Za-z0-9_/+~]|-(?=[0-9.])|\.(?=[A-Za-z0-9])){_CHARS}*(?: {_CHARS}+)*"
_QUOTED = r"'[^']*(?:''[^']*)*'|\"[^\"\\]*\"|\[\]|\{\}"
_KEY = r"[A-Za-z_][A-Za-z0-9_-]{0,127}"  # libyaml allows simple keys of 1024 characters
_LINE = re.compile(
    rf"( *)(?:(- +)(?=[^ ]))?(?:({_KEY}):(?: +({_PLAIN}|{_QUOTED}))?|({_PLAIN}|{_QUOTED}))?"
    r" *(?:(?<![^ ])#[\x20-\x7e]*)?"
)  # printable ASCII only: no tab, CR or control character, nothing outside ASCII
_MAX_DEPTH = 500  # libyaml refuses nesting beyond 1,000
_LIST, _DICT, _NONE = object(), object(), object()  # '[]', '{}'; absent


def _block(text: str, plain: Callable[[str], Any]) -> Any:
    """The document ``text`` when written in plain block style (see the module docstring),
    else :class:`_UnusualError`.

    Each line is ``(indent, column, key, value)`` (the column of its key or value: past
    its ``- ``, if any); the stack holds ``(indent, container)`` for each open mapping and
    sequence, the innermost also in ``top_indent, top``. A ``key:`` without a value waits
    for the next line: deeper (or a ``- `` at the key's own indentation, as ``yaml.dump``
    writes a list in a mapping) opens its value, anything else leaves it null.
    """
    parsed: dict[str, tuple[int, int, Any, Any]] = {}
    stack: list[tuple[int, Any]] = []
    root: Any = _NONE
    top: Any = None
    top_indent = -1
    waiting = False  # the last key of top waits for its value on the next line
    waiting_key: Any = None
    lines = text.split("\n")
    for line in lines:
        info = parsed.get(line)
        if info is None:
            info = _parse_line(line, plain)
            if len(parsed) < 4096:
                parsed[line] = info
        indent, col, key, value = info
        # Most lines are a key of the innermost mapping, or the first of a mapping opened
        # by the key before; the loop below handles every line.
        if (
            not waiting
            and indent == top_indent
            and col == indent
            and type(top) is dict
            and key is not _NONE
            and value is not _NONE
            and key not in top
        ):
            top[key] = _fresh(value) if value is _LIST or value is _DICT else value
            continue
        if col == indent and key is not _NONE:
            if waiting and indent > top_indent:
                waiting = False
                new_map: dict[Any, Any] = {}
                top[waiting_key] = new_map
                stack.append((top_indent, top))
                top, top_indent = new_map, indent
                if len(stack) > _MAX_DEPTH:
                    raise _UnusualError
            if indent == top_indent and not waiting and type(top) is dict and key not in top:
                if value is _NONE:
                    top[key] = None  # null unless the next line opens a collection
                    waiting, waiting_key = True, key
                else:
                    top[key] = _fresh(value) if value is _LIST or value is _DICT else value
                continue
        if indent < 0:  # blank or a comment
            continue
        dash = col != indent
        if waiting:
            waiting = False
            if indent > top_indent or (indent == top_indent and dash):
                new: Any = [] if dash else {}
                top[waiting_key] = new
                stack.append((top_indent, top))
                top, top_indent = new, indent
                if len(stack) > _MAX_DEPTH:
                    raise _UnusualError
        elif root is _NONE:
            if not dash and key is _NONE:  # a scalar document (one line)
                root = _fresh(value)
                top_indent = -2  # nothing may follow
                continue
            root = top = [] if dash else {}
            top_indent = indent
        # Close what this line is left of (and a list at its parent key's indentation that
        # a key line ends).
        while top_indent > indent or (top_indent == indent and not dash and type(top) is list):
            if not stack:
                raise _UnusualError  # left of the document's start
            top_indent, top = stack.pop()
        if top_indent != indent:
            raise _UnusualError  # a continued scalar, or bad indentation
        if dash:
            if type(top) is not list:
                raise _UnusualError
            if key is _NONE:
                top.append(_fresh(value))
                continue
            mapping: dict[Any, Any] = {}
            top.append(mapping)
            stack.append((top_indent, top))
            top, top_indent = mapping, col
            if len(stack) > _MAX_DEPTH:
                raise _UnusualError
        elif key is _NONE or type(top) is not dict:
            raise _UnusualError
        if key in top:
            raise _UnusualError  # the events path names the duplicate with its line
        if value is _NONE:
            top[key] = None
            waiting, waiting_key = True, key
        else:
            top[key] = _fresh(value)
    return None if root is _NONE else root


def _fresh(value: Any) -> Any:
    if value is _LIST:
        return []
    if value is _DICT:
        return {}
    return value


def _parse_line(line: str, plain: Callable[[str], Any]) -> tuple[int, int, Any, Any]:
    """``(indent, column of the key or value, key, value)`` of one line (``_NONE``: absent;
    indent -1: blank or a comment), or :class:`_UnusualError`."""
    m = _LINE.fullmatch(line)
    if m is None:
        raise _UnusualError
    indent, dash, key, value, item = m.groups()
    n = len(indent)
    col = n + len(dash) if dash else n
    if key is not None:
        return n, col, plain(key), _NONE if value is None else _scalar(value, plain)
    if item is not None:
        return n, col, _NONE, _scalar(item, plain)
    if dash:
        raise _UnusualError  # a '-' alone: its item on the next lines
    return -1, -1, _NONE, _NONE


def _scalar(text: str, plain: Callable[[str], Any]) -> Any:
    first = text[0]
    if first == "'":
        return text[1:-1].replace("''", "'")
    if first == '"':
        return text[1:-1]
    if text == "[]":
        return _LIST
    if text == "{}":
        return _DICT
    return plain(text)


# -- 2. libyaml's events ---------------------------------------------------------------------


def _from_events(yaml: Any, text: str, name: str, plain: Callable[[str], Any]) -> Any:
    """Build the single document of ``text`` from libyaml's events (see :func:`load_yaml`)."""
    scalar_event, alias_event = yaml.ScalarEvent, yaml.AliasEvent
    map_start, map_end = yaml.MappingStartEvent, yaml.MappingEndEvent
    seq_start, seq_end = yaml.SequenceStartEvent, yaml.SequenceEndEvent
    doc_start = yaml.DocumentStartEvent
    # One frame per open collection: [container, key (mappings; _NO_KEY before a key)].
    no_key = _NO_KEY
    stack: list[list[Any]] = []
    root: Any = None
    documents = 0
    for event in yaml.parse(text, Loader=yaml.CSafeLoader):
        cls = type(event)
        if cls is scalar_event:
            tag = event.tag
            if tag is not None and tag != "!":
                raise _UnusualError
            # quoted or a block: a string
            obj: Any = plain(event.value) if event.implicit[0] else event.value
        elif cls is map_start or cls is seq_start:
            if event.tag is not None and event.tag != "!":
                raise _UnusualError
            obj = {} if cls is map_start else []
        elif cls is map_end or cls is seq_end:
            obj = stack.pop()[0]
            if not stack:
                root = obj
                continue
            frame = stack[-1]
            container = frame[0]
            if type(container) is list:
                container.append(obj)
            else:  # a collection as a value (a collection as a key is refused on its start)
                container[frame[1]] = obj
                frame[1] = no_key
            continue
        elif cls is alias_event:
            raise ManifestError(
                f"manifest {name!r}: YAML aliases are not allowed{event.start_mark}"
            )
        else:
            if cls is doc_start:
                documents += 1
                if documents > 1:
                    raise _UnusualError  # PyYAML's own error names the second document
            continue
        if not stack:
            if type(obj) is dict or type(obj) is list:
                stack.append([obj, no_key])
            else:
                root = obj
            continue
        frame = stack[-1]
        container = frame[0]
        if type(container) is list:
            if type(obj) is dict or type(obj) is list:
                stack.append([obj, no_key])
            else:
                container.append(obj)
        elif frame[1] is no_key:  # a key
            if type(obj) is dict or type(obj) is list:
                raise ManifestError(f"manifest {name!r}: a key must be a scalar{event.start_mark}")
            try:
                dup = obj in container
            except TypeError:  # an unhashable key (a float NaN hashes; a set would not)
                raise _UnusualError from None
            if dup:
                raise ManifestError(
                    f"manifest {name!r}: duplicate key {_short(obj)}{event.start_mark}"
                )
            frame[1] = obj
        elif type(obj) is dict or type(obj) is list:
            stack.append([obj, no_key])
        else:
            container[frame[1]] = obj
            frame[1] = no_key
    return root


_NO_KEY = object()


# -- 3. PyYAML's safe constructor ---------------------------------------------------------------


def _load_yaml_safely(yaml: Any, text: str, name: str) -> Any:
    """PyYAML's safe constructor (libyaml's parser when there is one), aliases and
    duplicate keys refused."""
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, list | dict):
                    where = key_node.start_mark
                    raise ManifestError(f"manifest {name!r}: a key must be a scalar{where}")
                if key in seen:
                    raise ManifestError(
                        f"manifest {name!r}: duplicate key {_short(key)}{key_node.start_mark}"
                    )
                seen.add(key)
            return super().construct_mapping(node, deep)

    if "*" in text:  # an alias is written *name: look for one only then
        for event in yaml.parse(text, Loader=base):
            if isinstance(event, yaml.AliasEvent):
                raise ManifestError(
                    f"manifest {name!r}: YAML aliases are not allowed{event.start_mark}"
                )
    return yaml.load(text, Loader=Loader)  # a safe loader, see above
