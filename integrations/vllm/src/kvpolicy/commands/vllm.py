"""``kvpolicy vllm``, registered by kvpolicy-vllm (the command lives in
``kvpolicy.commands._vllm_cli``)."""

from kvpolicy.commands._main import CommandSpec

COMMAND = CommandSpec(
    help="The simulator cross-checked against vLLM's real scheduler (kvpolicy-vllm and vLLM).",
    target="kvpolicy.commands._vllm_cli:group",
    subcommands={
        "crosscheck": "Step the same requests through vLLM's scheduler and the simulator's "
        "vllm stack; print steps, preemptions and recomputed tokens of both and their "
        "differences.",
    },
)
