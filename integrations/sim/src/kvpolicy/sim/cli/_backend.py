"""``kvpolicy sim backend``: a simulated OpenAI-compatible server."""

from __future__ import annotations

import click

from kvpolicy.kvmodel.cli import GPU, MODEL

__all__ = ["backend_cmd"]


@click.command("backend")
@click.option(
    "--model",
    type=MODEL,
    default="Llama-3-8B",
    show_default=True,
    help="Model the simulated server serves.",
)
@click.option(
    "--gpu",
    type=GPU,
    default="H100-SXM",
    show_default=True,
    help="GPU the simulated server runs on.",
)
@click.option(
    "--stack",
    default="vllm",
    show_default=True,
    help="The server's policies: a preset or a YAML stack file (its gateway is not used: "
    "put `kvpolicy tenancy serve` in front instead).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port to listen on.",
)
@click.option(
    "--speed",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Simulated seconds per wall-clock second.",
)
@click.option(
    "--kv-events",
    "kv_events",
    default=None,
    metavar="ENDPOINT",
    help="Publish the prefix cache's changes as vLLM's KV cache events on this ZMQ "
    "address (e.g. tcp://127.0.0.1:5557; needs pyzmq and msgspec). Default: none.",
)
def backend_cmd(
    model: str, gpu: str, stack: str, host: str, port: int, speed: float, kv_events: str | None
) -> None:
    """Serve the OpenAI API from a simulated GPU server (no GPU needed).

    Requests are queued, batched and streamed at the pace of the simulator's time model
    under the load they bring; the generated text is placeholder words.
    """
    try:
        import uvicorn
    except ImportError as exc:
        raise click.UsageError(
            "the backend needs Starlette and uvicorn: "
            "pip install --find-links dist 'kvpolicy-sim[backend]'"
        ) from exc
    import attrs

    from kvpolicy.kvmodel import get_gpu, get_model
    from kvpolicy.sim import (
        ConfigError,
        GatewayConfig,
        TimingModel,
        build_stack,
        get_stack,
        server_context,
    )
    from kvpolicy.sim.backend import LiveEngine, create_app

    try:
        cfg = get_stack(stack)
        tm = TimingModel(get_model(model), get_gpu(gpu), **cfg.timing.constants())
        server = attrs.evolve(cfg, gateway=GatewayConfig())
        built = build_stack(server, server_context([], tm, cfg.engine))
        engine = LiveEngine(
            tm,
            cfg.engine,
            built,
            eviction_config=cfg.eviction,
            preemption_config=cfg.preemption,
            attention=cfg.attention.build(),
            speed=speed,
        )
    except (ConfigError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    events = None
    if kv_events is not None:
        from kvpolicy.sim.backend import KVEventPublisher

        if not kv_events.startswith(("tcp://", "ipc://")):
            raise click.BadParameter(
                f"must be a ZMQ address like tcp://127.0.0.1:5557: {kv_events!r}",
                param_hint="'--kv-events'",
            )
        try:
            events = KVEventPublisher(kv_events, engine.block_size)
        except ImportError as exc:
            raise click.UsageError(str(exc)) from exc
        except Exception as exc:  # zmq.ZMQError: the address is taken or not bindable
            raise click.BadParameter(
                f"cannot bind {kv_events!r}: {exc}", param_hint="'--kv-events'"
            ) from exc
    click.echo(
        f"simulated {model} on {gpu} ({cfg.name} stack) at http://{host}:{port}/v1", err=True
    )
    uvicorn.run(create_app(engine, model, events), host=host, port=port, log_level="warning")
