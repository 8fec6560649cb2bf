"""``kvpolicy admit``, registered by kvpolicy-admit
(the command lives in ``kvpolicy.commands._admit_cli``)."""

from kvpolicy.commands._main import CommandSpec

COMMAND = CommandSpec(
    help='Stability of continuous batching under growing KV caches (after "Service-Induced '
    'Congestion in Memory-Constrained LLM Serving").',
    target="kvpolicy.commands._admit_cli:group",
    subcommands={
        "analyze": "Eviction-free rate x*, worst-cycle throughput, spectral radius, GCD "
        "stability verdict and the shortest prompt that keeps the system stable.",
        "simulate": "Run the discrete-time model: throughput, evictions and queue growth.",
    },
)
