"""`seedflood peer` and `seedflood launch`: SeedFlood with real peers over the network, one
process a client, on this machine or many."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from seedflood.ui import USER_ERRORS, SetOption, config_or_fail
from seedflood.ui import fail as _fail
from seedflood.ui import progress as _progress

log = logging.getLogger(__name__)


def peer(
    config_file: Annotated[Path, typer.Argument(help="YAML run config (method seedflood)")],
    run_id: Annotated[str, typer.Option(help="The run's name; every peer of a run uses it")],
    initial_peers: Annotated[
        list[str] | None,
        typer.Option("--initial-peers", help="Multiaddr of a running peer (repeatable)"),
    ] = None,
    state_dir: Annotated[
        Path | None, typer.Option(help="Log, snapshots and identity; reuse it to restart")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Where results.json goes")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: all)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on (0: any free)")] = 0,
    pace: Annotated[float, typer.Option(help="At least this many seconds per round")] = 0.0,
    evaluate: Annotated[bool, typer.Option(help="Test accuracy of the final model")] = True,
    device: Annotated[
        str,
        typer.Option(help="Where the model and forwards run: auto (a GPU if any), cpu, cuda[:N]"),
    ] = "auto",
    allow: Annotated[
        Path | None,
        typer.Option(
            help="File of the public keys that may hold a seat (one per line; each peer's is in "
            "STATE_DIR/public.key). Without it the run is open to any key"
        ),
    ] = None,
    patience: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds to wait for a member that sends nothing before proposing its removal. "
            "The wait is never shorter than 10 round times or 18 s; raise it where a crashed "
            "peer takes longer than that to restart",
        ),
    ] = 0.0,
    set_: SetOption = None,
) -> None:
    """One SeedFlood client in this process, training with the run's other peers."""
    from seedflood.peers.membership import AllowlistError, read_allowlist
    from seedflood.peers.node import PeerError, PeerOptions, run_peer

    config = config_or_fail(config_file, set_)
    try:
        allowed = None if allow is None else read_allowlist(allow)
    except AllowlistError as error:
        raise _fail(error) from None
    options = PeerOptions(
        run_id=run_id,
        state_dir=state_dir or Path("peers") / run_id / "state",
        out_dir=out or Path("results") / run_id,
        initial_peers=initial_peers or [],
        host=host,
        port=port,
        pace=pace,
        evaluate=evaluate,
        device=device,
        allowed=allowed,
        patience=patience,
    )

    def show(done: int, record: dict[str, Any]) -> None:
        if done % 10 == 0 or done == config.rounds:
            log.info(
                "round %d/%d: loss %.4f, committed step %d",
                done,
                config.rounds,
                record["train_loss"],
                record["committed_step"],
            )

    try:
        results = run_peer(config, options, say=log.info, progress=show)
    except (*USER_ERRORS, PeerError) as error:
        raise _fail(error) from None
    log.info(
        "client %d: committed %d steps, state %s, %s bytes on its busiest edge; results in "
        "%s/results.json",
        results["client"],
        results["committed_step"] + 1,
        results["state_hash"][:16],
        f"{results['bytes_per_edge_max']:,.0f}",
        options.out_dir,
    )
    for text in results["divergences"]:
        log.error("divergence: %s", text)


def launch(
    config_file: Annotated[Path, typer.Argument(help="YAML run config (method seedflood)")],
    peers: Annotated[
        int | None, typer.Option(help="Peer processes to start (default: clients)")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Results directory")] = None,
    run_id: Annotated[str | None, typer.Option(help="The run's name (default: out's name)")] = None,
    pace: Annotated[float, typer.Option(help="At least this many seconds per round")] = 0.0,
    set_: SetOption = None,
) -> None:
    """Start real peers as local processes, wait for them, and merge their results."""
    from seedflood.peers.launch import LaunchError
    from seedflood.peers.launch import launch as launch_peers

    config = config_or_fail(config_file, set_)
    count = peers or config.clients
    if count != config.clients:
        set_ = [*(set_ or []), f"clients={count}"]
    out_dir = out or Path("results") / f"{config_file.stem}-peers"
    with _progress("[bold]round") as bar:
        task = bar.add_task("rounds", total=config.rounds, status=f"starting {count} peers")

        def show(statuses: list[dict[str, Any]]) -> None:
            rounds = [s.get("round", 0) for s in statuses]
            bar.update(
                task, completed=min(rounds), status=f"peers at rounds {min(rounds)}–{max(rounds)}"
            )

        try:
            results = launch_peers(
                config_file,
                peers=count,
                out_dir=out_dir,
                run_id=run_id or out_dir.name,
                overrides=set_ or [],
                pace=pace,
                show=show,
            )
        except LaunchError as error:
            raise _fail(error) from None
    log.log(
        logging.INFO if results["consensus"] else logging.ERROR,
        "%d peers: committed-state hashes %s (%s), %s bytes on the busiest edge, test accuracy "
        "%.4f",
        count,
        "all equal" if results["consensus"] else "NOT equal",
        results["state_hash"][:16],
        f"{results['bytes_per_edge_max']:,.0f}",
        results.get("accuracy", float("nan")),
    )
    log.info("results in %s/results.json; plots and tables: seedflood report %s", out_dir, out_dir)
