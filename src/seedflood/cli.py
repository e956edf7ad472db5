"""The ``seedflood`` command line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from seedflood import __version__
from seedflood.config import ConfigError
from seedflood.peers.commands import launch, peer
from seedflood.pipeline.commands import pipeline_app
from seedflood.ui import USER_ERRORS, SetOption, config_or_fail, configure_logging
from seedflood.ui import fail as _fail
from seedflood.ui import progress as _progress

log = logging.getLogger(__name__)
app = typer.Typer(add_completion=False, no_args_is_help=True)
app.add_typer(pipeline_app, name="pipeline")


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"seedflood {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Warnings and errors only, no progress bars")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug messages too")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit"
        ),
    ] = False,
) -> None:
    """Decentralized training of language models with no central server. Simulate many
    clients in one process (run, compare), train with real peers over the network (peer,
    launch), and read what runs wrote (report, replay, evaluate)."""
    if quiet and verbose:
        raise _fail(ValueError("--quiet and --verbose cannot be given together"))
    configure_logging(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)


@app.command()
def run(
    config_file: Annotated[Path, typer.Argument(help="YAML run config")],
    set_: SetOption = None,
    out: Annotated[Path | None, typer.Option(help="Results directory")] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the checkpoint in the results directory")
    ] = False,
) -> None:
    """Train with one method and write results.json and history.jsonl."""
    from seedflood.sim.checkpoint import CheckpointError
    from seedflood.sim.runner import run as run_simulation

    config = config_or_fail(config_file, set_)
    out_dir = out or Path("results") / config_file.stem
    with _progress("[bold]round") as bar:
        task = bar.add_task("rounds", total=config.rounds, status="loading model and data")

        def show(done: int, record: dict[str, Any]) -> None:
            if record["event"] in ("note", "nothing_to_resume"):
                bar.update(task, completed=done)
                # Asked to resume, it found nothing: worth a warning (compare, which always
                # resumes, says nothing).
                level = logging.INFO if record["event"] == "note" else logging.WARNING
                log.log(level, record["text"])
                return
            if record["event"] == "zero_shot":
                log.info("zero-shot test accuracy: %.4f", record["test_accuracy"])
                return
            if record["event"] == "replay":
                bar.update(task, completed=done, status=_replay_text(done, record))
                return
            status = f"loss {record['train_loss']:.4f}  val acc {record['accuracy']:.3f}"
            bar.update(task, completed=done, status=status)
            if record["event"] == "evaluation":
                log.info(_evaluation_text(done, record))

        try:
            results = run_simulation(config, out_dir, progress=show, resume=resume)
        except (*USER_ERRORS, CheckpointError) as error:
            raise _fail(error) from None
    for note in results["data_notes"]:
        log.warning(note)
    log.info(
        "consensus distance %.3g, bytes per edge max %s (%s messages), wall %.1f s (training "
        "%.1f s), peak RSS %.0f MB",
        results["consensus_distance"],
        f"{results['bytes_per_edge_max']:,}",
        f"{results['messages_per_edge_max']:,}",
        results["wall_seconds"],
        results["train_seconds"],
        results["peak_rss_mb"],
    )
    log.info("results in %s/results.json", out_dir)
    log.info(
        "plots and tables: seedflood report %s; curves: tensorboard --logdir %s", out_dir, out_dir
    )
    log.info(
        "zero-shot test accuracy %.4f → final test accuracy %.4f",
        results["zero_shot_accuracy"],
        results["accuracy"],
    )


app.command()(peer)
app.command()(launch)


REPLAY_LOG_EVERY = 10
"""Rounds between a lane's log lines while it replays its ledger, which takes minutes."""


def _replay_text(done: int, record: dict[str, Any]) -> str:
    return f"replaying the ledger: round {done} of {record['total']} (no forward pass)"


def _evaluation_text(done: int, record: dict[str, Any]) -> str:
    return (
        f"round {done}: train loss {record['train_loss']:.4f}, val accuracy "
        f"{record['accuracy']:.4f}, consensus distance {record['consensus_distance']:.3g}, "
        f"training {record['train_seconds']:,.0f} s"
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
    where: Annotated[
        list[str] | None,
        typer.Option(
            help="Only runs whose config has KEY at one of the VALUEs: KEY=VALUE[,VALUE...]; "
            "repeat it to narrow further (e.g. --where seed=1,2 --where clients=16)"
        ),
    ] = None,
) -> None:
    """Run every combination of a grid, skipping runs already finished, then write the report."""
    from seedflood.grid import claimed, parse_where, plan
    from seedflood.report import write_report
    from seedflood.sim.checkpoint import CheckpointError
    from seedflood.sim.runner import run as run_simulation

    try:
        runs = plan(
            grid_file,
            [v.strip() for v in only.split(",")] if only else (),
            parse_where(where or []),
        )
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
                    log.info("skip %s: %s", planned.name, why)
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
                        log.info("%s: %s", name, record["text"])
                    if record["event"] == "replay":
                        bar.update(rounds, completed=done, status=_replay_text(done, record))
                        if done == 1 or done % REPLAY_LOG_EVERY == 0:  # a lane's log: its progress
                            log.info("%s: %s", name, _replay_text(done, record))
                    if record["event"] == "evaluation":
                        # A lane's log file shows no bar: these lines are its progress.
                        log.info("%s: %s", name, _evaluation_text(done, record))
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
            log.info(
                "%s: accuracy %.4f, %s bytes per edge, %.0f s",
                planned.name,
                results["accuracy"],
                f"{results['bytes_per_edge_max']:,.0f}",
                results["wall_seconds"],
            )
            bar.advance(overall)
    log.info("report: %s", write_report([out_dir], out_dir))


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
        log.info("results: %s", write_paper_results(Path.cwd(), out or Path("docs/results.md")))
        return
    if not directories:
        raise _fail(ValueError("give results directories, or --paper"))
    target = out or directories[0]
    if len(directories) == 1 and in_progress(directories[0]):
        log.info("report: %s (in progress)", write_progress_report(directories[0], target))
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
    log.info("report: %s", path)


@app.command()
def replay(
    run_dir: Annotated[Path, typer.Argument(help="A SeedFlood run's directory or peer state dir")],
    out: Annotated[Path | None, typer.Option(help="Where the rebuilt model goes")] = None,
) -> None:
    """Rebuild a SeedFlood run's model from its ledger alone and check its state hash.

    The ledger is the base model and the message log; the rebuilt model must end on the state
    hash the run recorded."""
    from seedflood.sim.replay import replay as replay_ledger

    try:
        done = replay_ledger(run_dir, out)
    except USER_ERRORS as error:
        raise _fail(error) from None
    log.info(
        "replayed %s messages: state hash %s… equals the run's%s",
        f"{done['messages']:,}",
        done["state_hash"][:16],
        f"; model in {out}" if out else "",
    )


@app.command()
def evaluate(
    model_dir: Annotated[str, typer.Argument(help="A saved model directory (or any model name)")],
    task: Annotated[
        str | None, typer.Option(help="A built-in task whose test set scores it (default sst2)")
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option("--config", help="Score on this run config's task and test set instead"),
    ] = None,
    set_: SetOption = None,
) -> None:
    """Test accuracy (and loss) of a saved model on a task, scored as a run scores its model."""
    from seedflood.sim.replay import evaluate as evaluate_model

    if task is not None and config_file is not None:
        raise _fail(ConfigError("give --task or --config, not both"))
    chosen = [] if config_file is not None else [f"task={task or 'sst2'}"]
    config = config_or_fail(config_file, [*chosen, *(set_ or [])])
    try:
        scored = evaluate_model(model_dir, config)
    except USER_ERRORS as error:
        raise _fail(error) from None
    extra = "".join(
        f", {name} {scored[key]:.4f}"
        for key, name in (("eval_loss", "loss"), ("perplexity", "perplexity"))
        if key in scored
    )
    log.info(
        "%s: test accuracy %.4f%s on %d %s examples",
        model_dir,
        scored["accuracy"],
        extra,
        scored["test_examples"],
        scored["task"],
    )
