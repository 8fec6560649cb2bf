"""``kvpolicy kv``, registered by kvpolicy-kvmodel
(the command lives in ``kvpolicy.kvmodel._cli``)."""

from kvpolicy.commands._main import CommandSpec

COMMAND = CommandSpec(
    help="KV cost model and capacity planning.",
    target="kvpolicy.kvmodel._cli:group",
    subcommands={
        "plan": "Bytes per token, KV budget and how many sequences of CONTEXT tokens fit.",
    },
)
