"""``kvpolicy sim`` and ``kvpolicy demo``, registered by kvpolicy-sim (the commands live in
``kvpolicy.sim.cli``)."""

from kvpolicy.commands._main import CommandSpec

COMMAND = CommandSpec(
    help="The reference serving simulator: run, compare and sweep policy stacks.",
    target="kvpolicy.sim.cli._sim:group",
    subcommands={
        "run": "Simulate one policy stack on a workload or a trace (on a fleet of replicas "
        "with --replicas, --router or --autoscaler).",
        "compare": "Simulate several policy stacks on one workload, side by side (each behind "
        "every --router and every --autoscaler given, on a fleet of --replicas).",
        "sweep": "Simulate a grid of stack parameters on local processes or on Ray.",
        "fit-timing": "Fit the time model's calibration constants to measured iterations.",
        "fit-attention": "Record SmolLM2-135M's attention on a text and fit the synthetic "
        "attention model.",
        "backend": "Serve the OpenAI API from a simulated GPU server (no GPU needed).",
    },
    elsewhere={
        "fit-attention": "kvpolicy.sim.cli._fit:fit_attention_cmd",
        "backend": "kvpolicy.sim.cli._backend:backend_cmd",
    },
)

DEMO = CommandSpec(
    help="A vLLM-like stack against the kvpolicy stack on the multi-tenant workload.",
    target="kvpolicy.sim.cli._demo:demo",
)
