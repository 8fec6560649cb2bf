"""``kvpolicy tenancy``, registered by kvpolicy-tenancy (the command lives in
``kvpolicy.tenancy._cli``)."""

from kvpolicy.commands._main import CommandSpec

COMMAND = CommandSpec(
    help='Token pools ("Token Management in Multi-Tenant AI Inference Platforms"): gateway, '
    "experiments, manifests.",
    target="kvpolicy.tenancy._cli:group",
    subcommands={
        "serve": "Run the OpenAI-compatible token-pool gateway in front of BACKEND (every "
        "setting: ``python -m kvpolicy.tenancy.gateway --help``).",
        "replay": "Replay one of the paper's two experiments; a summary per entitlement.",
        "check": "Validate a pool MANIFEST (exit 1 with the error naming the field).",
        "crds": "Write the TokenPool and TokenEntitlement CRDs (YAML) into OUT.",
    },
)
