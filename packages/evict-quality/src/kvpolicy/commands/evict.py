"""``kvpolicy evict``, registered by kvpolicy-evict-quality, the harness it runs (the command
lives in ``kvpolicy.commands._evict_cli``). With kvpolicy-evict alone, ``kvpolicy evict``
says to install kvpolicy-evict-quality."""

from kvpolicy.commands._main import CommandSpec

COMMAND = CommandSpec(
    help="Quality of eviction policies on a real LLM (SmolLM2-135M).",
    target="kvpolicy.commands._evict_cli:group",
    subcommands={
        "eval": "Perplexity (or lookup accuracy) of each policy at each budget, decoding TOKENS "
        "tokens one at a time.",
        "train": "Record returns on the license texts and train the logits MLP (cached) and "
        "compact fit.",
        "stats": "Attention sink mass, decay with distance and heavy-hitter concentration of "
        "the model.",
    },
)
