"""``kvpolicy tenancy``: the token-pool gateway, the paper's experiments, manifest checks (the
library is imported when a command runs, not for its ``--help``)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import click

from kvpolicy.tenancy._errors import ManifestError

__all__ = ["group"]


@click.group()
def group() -> None:
    """Token pools ("Token Management in Multi-Tenant AI Inference Platforms"): gateway,
    experiments, manifests."""


@group.command("serve")
@click.option("--config", "config", type=click.Path(exists=True, dir_okay=False), required=True)
@click.option(
    "--backend",
    "backends",
    multiple=True,
    help="Base URL of an OpenAI-compatible backend (repeat for a fleet; or the manifest's "
    "'backends:' list).",
)
@click.option(
    "--router",
    default=None,
    help="How requests are spread over several backends: a `kvpolicy.routing` entry point "
    "(default: the manifest's routing.router, else least-requests).",
)
@click.option(
    "--autoscaler",
    default=None,
    help="A `kvpolicy.autoscaling` entry point whose target is exported as "
    "kvpolicy_desired_replicas (default: the manifest's autoscaling.autoscaler).",
)
@click.option("--api-keys", type=click.Path(exists=True, dir_okay=False), required=True)
@click.option("--redis", "redis_url", default=None, help="redis://host:port/db (replicas).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    default=8000,
    type=click.IntRange(0, 65535),
    show_default=True,
    help="Port to listen on.",
)
@click.option(
    "--bytes-per-token",
    default=1,
    type=click.IntRange(min=1),
    show_default=True,
    help="KV bytes charged per token against kv_cache_gib (the served model's; see "
    "`kvpolicy kv plan`). 1 counts the pool's KV limits in tokens.",
)
@click.option("--model", "models", multiple=True, help="Models served (default: any).")
@click.option(
    "--admin-port",
    default=None,
    type=click.IntRange(0, 65535),
    help="Serve /metrics and /healthz without a key on 127.0.0.1:PORT (operators only). "
    "On the public port they need KVPOLICY_ADMIN_KEY as a bearer key.",
)
def serve(
    config: str,
    backends: tuple[str, ...],
    router: str | None,
    autoscaler: str | None,
    api_keys: str,
    redis_url: str | None,
    host: str,
    port: int,
    bytes_per_token: int,
    models: tuple[str, ...],
    admin_port: int | None,
) -> None:
    """Run the OpenAI-compatible token-pool gateway in front of BACKEND (every setting:
    ``python -m kvpolicy.tenancy.gateway --help``)."""
    try:
        import os

        from kvpolicy.tenancy import load_gate, load_lease_gate
        from kvpolicy.tenancy.gateway import (
            Admission,
            LocalGate,
            create_admin_app,
            create_app,
            fleet_settings,
            load_api_keys,
        )
        from kvpolicy.tenancy.gateway import serve as serve_gateway
    except ImportError as err:
        raise click.ClickException(
            "the gateway needs its extra: "
            f"pip install --find-links dist 'kvpolicy-tenancy[gateway]' ({err})"
        ) from err
    try:
        fleet = fleet_settings(config, backends, router, autoscaler)
        keys = load_api_keys(api_keys)
        if redis_url:
            gate: Any = load_lease_gate(config, bytes_per_token, redis_url)
        else:
            gate = LocalGate(load_gate(config, bytes_per_token))
    except (ManifestError, ValueError) as err:
        raise click.ClickException(str(err)) from err
    admission = Admission(gate, keys, models=models or None)
    admin_key = os.environ.get("KVPOLICY_ADMIN_KEY") or None
    app: Any = create_app(
        admission,
        fleet.backends,
        admin_key=admin_key,
        routing=fleet.routing,
        autoscaler=fleet.autoscaler,
    )
    backend = ", ".join(b.url for b in fleet.backends)
    if len(fleet.backends) > 1 and fleet.routing is not None:
        backend += f" (router {fleet.routing.router})"
    click.echo(
        _banner(config, backend, host, port, keys, redis_url, admin_port, admin_key), err=True
    )
    serve_gateway(
        app,
        host=host,
        port=port,
        admin_app=create_admin_app(admission, app.fleet) if admin_port is not None else None,
        admin_port=admin_port,
    )


def _banner(
    config: str,
    backend: str,
    host: str,
    port: int,
    keys: dict[str, str],
    redis_url: str | None,
    admin_port: int | None,
    admin_key: str | None,
) -> str:
    """What the gateway serves and where: printed once it is about to listen (a Redis
    URL's password is not shown)."""
    from urllib.parse import urlsplit

    if redis_url:
        u = urlsplit(redis_url)
        where = f"{u.scheme}://{u.hostname}:{u.port or 6379}{u.path}"
        state = f"leases in Redis at {where}"
    else:
        state = "state in this process (one replica)"
    if admin_port is not None:
        admin = f"/metrics and /healthz on http://127.0.0.1:{admin_port}"
    elif admin_key:
        admin = "/metrics and /healthz with KVPOLICY_ADMIN_KEY"
    else:
        admin = "/metrics and /healthz's load closed (set KVPOLICY_ADMIN_KEY or --admin-port)"
    tenants = len(set(keys.values()))
    return (
        f"kvpolicy tenancy serve: http://{host}:{port} -> {backend}; manifest {config}, "
        f"{len(keys)} API keys for {tenants} tenants; {state}; {admin}"
    )


@group.command("replay")
@click.option("--scenario", type=click.Choice(["cross-class", "fair-share"]), required=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list.")
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory to save the replay's plots in (PNG).",
)
def replay(scenario: str, as_json: bool, plot_dir: str | None) -> None:
    """Replay one of the paper's two experiments; a summary per entitlement."""
    from rich.console import Console
    from rich.table import Table

    from kvpolicy.tenancy import replay_experiment

    run, rows = replay_experiment(scenario)
    if plot_dir is not None:
        _plot(run, rows, scenario, pathlib.Path(plot_dir))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"tenancy replay {scenario}")
    for col in rows[0]:
        table.add_column(col)
    for row in rows:
        table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()))
    Console().print(table)


def _plot(run: Any, rows: list[dict[str, Any]], scenario: str, out: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for row in rows:
        name = row["name"]
        for ax, key in zip(axes, ("in_flight", "debt"), strict=True):
            pts = run.series(key, name)
            ax.plot([t for t, _ in pts], [v for _, v in pts], label=name)
            ax.set_ylabel(key)
    axes[0].legend()
    axes[1].set_xlabel("time (s)")
    fig.suptitle(f"tenancy replay {scenario}")
    fig.savefig(out / f"{scenario}.png", dpi=100)
    plt.close(fig)


@group.command("check")
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False))
def check(manifest: str) -> None:
    """Validate a pool MANIFEST (exit 1 with the error naming the field)."""
    from kvpolicy.tenancy import fleet_settings, load_gate, load_manifest

    try:
        pool = load_manifest(manifest)
        load_gate(manifest, 1)
        fleet = fleet_settings(manifest, backends_required=False)
    except ManifestError as err:
        raise click.ClickException(str(err)) from err
    more = f"; {len(fleet.backends)} backends" if fleet.backends else ""
    click.echo(f"ok: pool {pool.name!r} with {len(pool.entitlements)} entitlements{more}")


@group.command("crds")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True)
def crds(out_dir: str) -> None:
    """Write the TokenPool and TokenEntitlement CRDs (YAML) into OUT."""
    import yaml

    from kvpolicy.tenancy import crd_documents

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for doc in crd_documents():
        path = out / f"{doc['spec']['names']['singular']}.yaml"
        head = "# Generated by `kvpolicy tenancy crds --out DIR` from "
        head += "kvpolicy.tenancy.crd_documents(); do not edit.\n"
        path.write_text(head + yaml.safe_dump(doc, sort_keys=False))
        click.echo(str(path))
