"""The Redis gate's Lua scripts (``kvpolicy/tenancy/lua/*.lua``): each compiles in a real
Redis, and the files keep to one style."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import pytest

from kvpolicy.tenancy._lease import SCRIPTS

LUA = resources.files("kvpolicy.tenancy") / "lua"
FILES = ["common", *SCRIPTS]


def _text(name: str) -> str:
    return (LUA / f"{name}.lua").read_text()


class TestLuaFiles:
    @pytest.mark.parametrize("name", FILES)
    def test_style(self, name: str) -> None:
        """No tabs, no trailing blanks, lines of at most 100 characters, every function
        local, and a script's first lines say its arguments (``ARGV 17..``) or that it
        takes none."""
        text = _text(name)
        for number, line in enumerate(text.splitlines(), 1):
            assert "\t" not in line, (name, number)
            assert line == line.rstrip(), (name, number)
            assert len(line) <= 100, (name, number)
            assert not re.match(r"\s*function\b", line), (name, number, "a global function")
        if name != "common":
            head = text.splitlines()[1]
            assert head.startswith(("-- ARGV 17..", "-- No script ARGV")), name

    @pytest.mark.parametrize("name", SCRIPTS)
    def test_compiles_in_redis(self, name: str, redis_url: str) -> None:
        """Redis compiles common.lua and the script together (``SCRIPT LOAD``)."""
        import redis

        client: Any = redis.Redis.from_url(redis_url)
        try:
            sha = client.script_load(_text("common") + _text(name))
            assert re.fullmatch(r"[0-9a-f]{40}", sha)
        finally:
            client.close()

    def test_a_syntax_error_is_caught(self, redis_url: str) -> None:
        """The compile check is real: a broken script is refused."""
        import redis

        client: Any = redis.Redis.from_url(redis_url)
        try:
            with pytest.raises(redis.exceptions.ResponseError, match="Error compiling script"):
                client.script_load(_text("common") + "local x = = 1\n")
        finally:
            client.close()
