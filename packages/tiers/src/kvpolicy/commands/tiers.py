"""``kvpolicy tiers``, registered by kvpolicy-tiers
(the command lives in ``kvpolicy.commands._tiers_cli``)."""

from kvpolicy.commands._main import CommandSpec

COMMAND = CommandSpec(
    help="KV tiers below HBM (after Kareto, the tiered KV-cache optimizer): Pareto sizing and "
    "reuse analysis.",
    target="kvpolicy.commands._tiers_cli:group",
    subcommands={
        "plan": "Adaptive Pareto search over DRAM GiB x disk GiB (Algorithm 1) by trace replay.",
        "reuse": "Reuse analysis, the prefix tree's top subtrees and their fitted group TTLs.",
    },
)
