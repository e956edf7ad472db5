"""The ``seedflood`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from seedflood.config import ConfigError, load_config
from seedflood.pipeline.commands import pipeline_app
from seedflood.ui import USER_ERRORS, console
from seedflood.ui import fail as _fail
from seedflood.ui import progress as _progress

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
app.add_typer(pipeline_app, name="pipeline")


@app.callback()
def main() -> None:
    """Decentralized training of language models with no central server."""


@app.command()
def run(
    config_file: Annotated[Path, typer.Argument(help="YAML run config")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config key: key=value")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Results directory")] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the checkpoint in the results directory")
    ] = False,
) -> None:
    """Train with one method and write results.json and history.jsonl."""
    from seedflood.sim.checkpoint import CheckpointError
    from seedflood.sim.runner import run as run_simulation

    try:
        config = load_config(config_file, set_ or [])
    except ConfigError as error:
        raise _fail(error) from None
    out_dir = out or Path("results") / config_file.stem
    with _progress("[bold]round") as bar:
        task = bar.add_task("rounds", total=config.rounds, status="loading model and data")

        def show(done: int, record: dict[str, Any]) -> None:
            if record["event"] == "note":
                bar.update(task, completed=done)
                console.print(record["text"])
                return
            if record["event"] == "zero_shot":
                console.print(f"zero-shot test accuracy: {record['test_accuracy']:.4f}")
                return
            status = f"loss {record['train_loss']:.4f}  val acc {record['accuracy']:.3f}"
            bar.update(task, completed=done, status=status)
            if record["event"] == "evaluation":
                bar.console.print(
                    f"round {done}: train loss {record['train_loss']:.4f}, "
                    f"val accuracy {record['accuracy']:.4f}, "
                    f"consensus distance {record['consensus_distance']:.3g}"
                )

        try:
            results = run_simulation(config, out_dir, progress=show, resume=resume)
        except (*USER_ERRORS, CheckpointError) as error:
            raise _fail(error) from None
    for note in results["data_notes"]:
        console.print(f"[yellow]note:[/] {note}")
    console.print(
        f"consensus distance {results['consensus_distance']:.3g}, "
        f"bytes per edge max {results['bytes_per_edge_max']:,} "
        f"({results['messages_per_edge_max']:,} messages), "
        f"wall {results['wall_seconds']:.0f} s, peak RSS {results['peak_rss_mb']:.0f} MB"
    )
    console.print(f"results in {out_dir}/results.json")
    console.print(f"plots and tables: seedflood report {out_dir}")
    console.print(
        f"zero-shot test accuracy {results['zero_shot_accuracy']:.4f} → "
        f"final test accuracy {results['accuracy']:.4f}"
    )


def _config(config_file: Path | None, set_: list[str] | None) -> Any:
    try:
        return load_config(config_file, set_ or [])
    except ConfigError as error:
        raise _fail(error) from None


SetOption = Annotated[
    list[str] | None, typer.Option("--set", help="Override a config key: key=value")
]


@app.command()
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
    set_: SetOption = None,
) -> None:
    """One SeedFlood client in this process, training with the run's other peers."""
    from seedflood.peers.node import PeerError, PeerOptions, run_peer

    config = _config(config_file, set_)
    options = PeerOptions(
        run_id=run_id,
        state_dir=state_dir or Path("peers") / run_id / "state",
        out_dir=out or Path("results") / run_id,
        initial_peers=initial_peers or [],
        host=host,
        port=port,
        pace=pace,
        evaluate=evaluate,
    )

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False)

    def show(done: int, record: dict[str, Any]) -> None:
        if done % 10 == 0 or done == config.rounds:
            say(
                f"round {done}/{config.rounds}: loss {record['train_loss']:.4f}, "
                f"committed step {record['committed_step']}"
            )

    try:
        results = run_peer(config, options, say=say, progress=show)
    except (*USER_ERRORS, PeerError) as error:
        raise _fail(error) from None
    say(
        f"client {results['client']}: committed {results['committed_step'] + 1} steps, "
        f"state {results['state_hash'][:16]}, {results['bytes_per_edge_max']:,.0f} bytes on its "
        f"busiest edge; results in {options.out_dir}/results.json"
    )
    for text in results["divergences"]:
        console.print(f"[bold red]divergence:[/] {text}")


@app.command()
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

    config = _config(config_file, set_)
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
    agreed = "all equal" if results["consensus"] else "[bold red]NOT equal[/]"
    console.print(
        f"{count} peers: committed-state hashes {agreed} ({results['state_hash'][:16]}), "
        f"{results['bytes_per_edge_max']:,.0f} bytes on the busiest edge, "
        f"test accuracy {results.get('accuracy', float('nan')):.4f}"
    )
    console.print(
        f"results in {out_dir}/results.json; plots and tables: seedflood report {out_dir}"
    )


@app.command()
def compare(
    grid_file: Annotated[Path, typer.Argument(help="YAML grid: variants × swept keys")],
    out: Annotated[Path | None, typer.Option(help="Comparison directory")] = None,
    resume: Annotated[
        bool,
        typer.Option(help="Continue an interrupted run from its checkpoint (else restart it)"),
    ] = True,
    only: Annotated[
        str | None, typer.Option(help="Comma-separated variants to run (default: all)")
    ] = None,
) -> None:
    """Run every combination of a grid, skipping runs already finished, then write the report."""
    from seedflood.compare import claimed, plan
    from seedflood.report import write_report
    from seedflood.sim.checkpoint import CheckpointError
    from seedflood.sim.runner import run as run_simulation

    try:
        runs = plan(grid_file, [v.strip() for v in only.split(",")] if only else ())
    except ConfigError as error:
        raise _fail(error) from None
    out_dir = out or Path("results") / grid_file.stem
    with _progress("{task.description}") as bar:
        overall = bar.add_task("[bold]runs", total=len(runs), status="")
        for planned in runs:
            # Claimed before it is checked: another process may finish it in between.
            with claimed(planned.directory(out_dir)) as holder:
                if holder is not None or planned.is_done(out_dir):
                    why = (
                        f"{holder} is running it" if holder else "finished earlier with this config"
                    )
                    bar.console.print(f"skip {planned.name}: {why}")
                    bar.advance(overall)
                    continue
                bar.update(overall, status=planned.name)
                rounds = bar.add_task("  rounds", total=planned.config.rounds, status="loading")

                def show(
                    done: int,
                    record: dict[str, Any],
                    rounds: Any = rounds,
                    name: str = planned.name,
                ) -> None:
                    if record["event"] == "note":
                        bar.console.print(f"{name}: {record['text']}")
                    if record["event"] in ("round", "evaluation"):
                        bar.update(
                            rounds, completed=done, status=f"val acc {record['accuracy']:.3f}"
                        )

                try:
                    results = run_simulation(
                        planned.config, planned.directory(out_dir), show, resume=resume
                    )
                except (*USER_ERRORS, CheckpointError) as error:
                    raise _fail(error) from None
            bar.remove_task(rounds)
            bar.console.print(
                f"{planned.name}: accuracy {results['accuracy']:.4f}, "
                f"{results['bytes_per_edge_max']:,.0f} bytes per edge, "
                f"{results['wall_seconds']:.0f} s"
            )
            bar.advance(overall)
    report = write_report([out_dir], out_dir)
    console.print(f"report: {report}")


@app.command()
def report(
    directories: Annotated[
        list[Path] | None, typer.Argument(help="Directories holding results.json")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Where report.md and plots go")] = None,
    paper: Annotated[
        bool, typer.Option("--paper", help="Regenerate docs/results.md from ./results")
    ] = False,
) -> None:
    """Tables and plots from finished runs; --paper: one section per claim of the papers."""
    from seedflood.paper.document import write_paper_results
    from seedflood.pipeline.report import find_pipeline_runs, write_pipeline_report
    from seedflood.report import in_progress, write_progress_report, write_report

    if paper:
        console.print(f"results: {write_paper_results(Path.cwd(), out or Path('docs/results.md'))}")
        return
    if not directories:
        raise _fail(ValueError("give results directories, or --paper"))
    target = out or directories[0]
    if len(directories) == 1 and in_progress(directories[0]):
        console.print(f"report: {write_progress_report(directories[0], target)} (in progress)")
        return
    pipeline_runs = [run for d in directories if d.exists() for run in find_pipeline_runs(d)]
    try:
        path = (
            write_pipeline_report(pipeline_runs, target)
            if pipeline_runs
            else write_report(directories, target)
        )
    except ValueError as error:
        raise _fail(error) from None
    console.print(f"report: {path}")


@app.command()
def replay(
    run_dir: Annotated[Path, typer.Argument(help="A SeedFlood run's directory or peer state dir")],
    out: Annotated[Path | None, typer.Option(help="Where the rebuilt model goes")] = None,
) -> None:
    """Rebuild a SeedFlood run's model from its ledger alone (base model + message log) and
    check it ends on the run's state hash."""
    from seedflood.sim.replay import replay as replay_ledger

    try:
        done = replay_ledger(run_dir, out)
    except USER_ERRORS as error:
        raise _fail(error) from None
    console.print(
        f"replayed {done['messages']:,} messages: state hash {done['state_hash'][:16]}… equals "
        f"the run's" + (f"; model in {out}" if out else "")
    )


@app.command()
def evaluate(
    model_dir: Annotated[str, typer.Argument(help="A saved model directory (or any model name)")],
    task: Annotated[str, typer.Option(help="The task whose test set scores it")] = "sst2",
    set_: SetOption = None,
) -> None:
    """Test accuracy of a saved model on a task, scored as a run scores its final model."""
    from seedflood.sim.replay import evaluate as evaluate_model

    config = _config(None, [f"task={task}", *(set_ or [])])
    try:
        scored = evaluate_model(model_dir, config)
    except USER_ERRORS as error:
        raise _fail(error) from None
    console.print(
        f"{model_dir}: test accuracy {scored['accuracy']:.4f} on {scored['test_examples']} "
        f"{task} examples"
    )
