"""The rules behind each verdict, on plain numbers: what counts as learned, ahead, behind,
reproduced or partly."""

from __future__ import annotations

from pathlib import Path

import pytest

from seedflood.learning.scoring import TokenizedExample, majority_rate
from seedflood.paper.bench import codec_bytes_per_edge, paper_convention
from seedflood.paper.scaling import unlearned
from seedflood.paper.verdicts import (
    compare,
    interval,
    main_verdict,
    percent_interval,
    scaling_verdict,
    so_far,
    subcge_verdict,
)
from seedflood.report import present_runs
from tests.paper.fabricate import write_run


@pytest.mark.parametrize(
    ("normalised", "verdict"),
    [
        ({"dsgd": {16: 1.0}, "seedflood": {16: 0.9}}, "**Verdict: not yet run.**"),
        # SeedFlood keeps 90% → 89% up to 64 but has no 128-client run: partly, not reproduced
        (
            {"seedflood": {16: 0.9, 64: 0.89}, "dsgd-lora": {16: 0.8, 64: 0.7}},
            "**Verdict: partly**",
        ),
        ({"seedflood": {16: 0.9, 128: 0.8}, "dsgd-lora": {16: 0.8, 128: 0.81}}, "**Verdict: not**"),
    ],
)
def test_scaling_verdict_needs_the_128_client_run_to_reproduce(
    normalised: dict[str, dict[int, float]], verdict: str
) -> None:
    assert scaling_verdict(normalised, rounds={m: 3 for m in normalised}).startswith(verdict)


def test_a_scaling_verdict_without_degrading_gossip_names_its_rounds() -> None:
    curves = {"seedflood": {16: 0.9, 64: 0.9}, "choco-lora": {16: 0.7, 64: 0.75}}
    verdict = scaling_verdict(curves, rounds={"seedflood": 30, "choco-lora": 3})
    assert verdict.startswith("**Verdict: partly**")
    assert (
        "degrading: none of choco-lora. Here choco-lora communicated 3 times against the paper's"
        in verdict
    )


def test_a_method_that_does_not_learn_is_named_but_not_judged() -> None:
    curves = {"seedflood": {16: 0.9, 32: 0.9}, "dzsgd-lora": {16: 0.62, 32: 0.67}}
    curves |= {"dsgd-lora": {16: 0.8, 32: 0.7}}
    rounds = {"seedflood": 30, "dzsgd-lora": 30, "dsgd-lora": 3}
    verdict = scaling_verdict(curves, rounds, unlearned=["dzsgd-lora"])
    assert "degrading: dsgd-lora of dsgd-lora." in verdict
    assert verdict.endswith(
        "Not judged: dzsgd-lora 62.0% at 16 → 67.0% at 32, never 5 points above the zero-shot "
        "model or the majority answer: it does not learn in this budget, so its "
        "curve is noise."
    )
    judged = scaling_verdict(curves, rounds)
    assert "degrading: dsgd-lora of dsgd-lora, dzsgd-lora." in judged
    assert "Not judged" not in judged


def _cell(method: str, task: str, accuracy: float, floor: float) -> dict[str, object]:
    cell = {"method": method, "task": task, "topology": "ring", "accuracy": accuracy}
    return {**cell, "floor": floor}


def test_a_task_whose_dsgd_does_not_learn_is_named_but_not_judged() -> None:
    """RTE's DSGD ends at the majority answer's 52.7% (6 points above its untrained model's
    46.6%, which sits below chance): SeedFlood's 87% of it is not judged; SST-2's cell is."""
    rte = [_cell("seedflood", "rte", 0.459, 0.527), _cell("dsgd", "rte", 0.527, 0.527)]
    rte.append(_cell("dzsgd-lora", "rte", 0.469, 0.527))
    sst2 = [_cell("seedflood", "sst2", 0.70, 0.51), _cell("dsgd", "sst2", 0.75, 0.51)]
    verdict = main_verdict([*sst2, *rte], complete=False, fallback=False)
    assert verdict.startswith("**Verdict: partly** (an incomplete grid")
    assert "sst2/ring: SeedFlood at 93.3% of DSGD (paper 94–96%); no rivals ran." in verdict
    assert "rte/ring: SeedFlood at" not in verdict
    assert verdict.endswith(
        "Not judged: rte/ring (DSGD 52.7%, SeedFlood 45.9%, to beat 52.7%): DSGD ends less than 5 "
        "points above the better of the untrained model and always answering the most common "
        "label, so it has not learned that task in this budget and the ratios to it are noise."
    )
    assert main_verdict(rte, complete=False, fallback=False).startswith(
        "**Verdict: not tested at this scale.** In every cell run, rte/ring (DSGD 52.7%, "
        "SeedFlood 45.9%, to beat 52.7%), DSGD ends less than 5 points above"
    )
    learned = [_cell("seedflood", "rte", 0.60, 0.527), _cell("dsgd", "rte", 0.62, 0.527)]
    assert "rte/ring: SeedFlood at 96.8% of DSGD" in main_verdict(learned, False, False)


def test_a_full_grid_reproduces_only_where_every_cell_could_test_the_claim() -> None:
    sst2 = [_cell("seedflood", "sst2", 0.73, 0.51), _cell("dsgd", "sst2", 0.75, 0.51)]
    rte = [_cell("seedflood", "rte", 0.459, 0.527), _cell("dsgd", "rte", 0.527, 0.527)]
    assert main_verdict(sst2, complete=True, fallback=False).startswith(
        "**Verdict: reproduced** (the full grid; ahead or behind means a two-sided Welch's t-test "
        "on the seeds at p < 0.05): sst2/ring: SeedFlood at 97.3% of DSGD"
    )
    assert main_verdict([*sst2, *rte], complete=True, fallback=False).startswith(
        "**Verdict: partly** (the full grid; 1 of 2 cells could test it; ahead or behind means a "
        "two-sided Welch's t-test on the seeds at p < 0.05): sst2/ring: "
    )


def test_the_majority_rate_is_the_share_of_the_most_common_label() -> None:
    examples = [TokenizedExample((1,), ((2,), (3,)), label) for label in (1, 1, 0, 1, 2)]
    assert majority_rate(examples) == 0.6
    with pytest.raises(ValueError, match="empty"):
        majority_rate([])


def test_a_run_must_beat_the_majority_answer_as_well_as_its_untrained_model(
    tmp_path: Path,
) -> None:
    """DZSGD-LoRA gains 6 points on its below-chance untrained model but ends at the majority
    answer: not learned. Runs without a recorded majority rate fall back to the zero-shot."""
    for clients, majority in ((16, 0.527), (32, None)):
        extra = {} if majority is None else {"majority_accuracy": majority}
        name = f"dzsgd-lora_clients-{clients}_seed-0"
        write_run(tmp_path, "paper-scaling", name, 0.527, clients=clients, zero_shot=0.466, **extra)
    runs = present_runs(tmp_path / "results" / "paper-scaling")
    assert sorted(round(r.floor, 3) for r in runs) == [0.466, 0.527]
    assert unlearned(runs) == []  # the 32-client run rose 6.1 points over its zero-shot
    (run32,) = [r for r in runs if r.results["clients"] == 32]
    run32.results["majority_accuracy"] = 0.527
    assert unlearned(runs) == ["dzsgd-lora"]


def test_subcge_verdict_judges_rank_and_refresh_apart() -> None:
    # rank holds at both periods; T = 1 loses 5.2 points at rank 64, gains at 8 and 32
    measured = {(8, 1): 0.562, (32, 1): 0.748, (64, 1): 0.708}
    measured |= {(8, 1000): 0.55, (32, 1000): 0.72, (64, 1000): 0.76}
    verdict = subcge_verdict(measured)
    assert verdict.startswith(
        "**Verdict: partly**: ranks below 32 under every rank from 32 at 2 of 2"
    )
    assert verdict.endswith(
        "T = 1 loses more than 2 points to a longer period at rank 64 of 8, 32, 64."
    )
    assert subcge_verdict({(32, 1000): 0.7}).startswith("**Verdict: not yet run.**")


def test_comparisons_are_tested_on_the_seeds_and_intervals_follow_student() -> None:
    """Ahead or behind needs Welch's test at p < 0.05 on three seeds a side; seeds that overlap
    are not told apart; one seed a side has no test, so the means decide and no p is claimed."""
    ours = [0.70, 0.71, 0.72]
    # t = 0.10 / (0.01 · sqrt(2/3)) = 12.2 with 4 degrees of freedom
    assert compare(ours, [0.60, 0.61, 0.62]) == (1, pytest.approx(2.55e-4, rel=0.01))
    assert compare(ours, [0.75, 0.76, 0.77])[0] == -1
    order, p = compare(ours, [0.69, 0.715, 0.73])
    assert order == 0 and p is not None and p > 0.5
    assert compare([0.70], [0.69]) == (1, None)
    # 95% interval of three values 1 point apart: t(0.975, 2) = 4.303 times 0.01 / sqrt(3)
    assert interval(ours) == pytest.approx(4.303 * 0.01 / 3**0.5, rel=1e-3)
    assert interval([0.7]) == 0.0
    assert percent_interval(ours) == "71.0 ± 2.5" and percent_interval([0.7]) == "70.0"


def test_bytes_in_the_papers_convention_are_one_way_and_values_only() -> None:
    """Gossip counts both directions of an edge; ChocoSGD's top-k also sends a 4-byte index per
    4-byte value; a flooded message crosses an edge once."""
    assert paper_convention("dsgd", 100.0) == 50.0
    assert paper_convention("choco-lora", 100.0) == 25.0
    assert paper_convention("seedflood", 100.0) == 100.0


def test_codec_bytes_match_the_flooding_benchmark() -> None:
    # 26 rounds with a 1-byte base step (24-byte packets), 974 with 2 bytes (25): × 16 origins
    assert codec_bytes_per_edge(16, 5000, 5, "fp32") == 16 * (26 * 24 + 974 * 25) == 399_584
    assert codec_bytes_per_edge(16, 5000, 1, "fp32") == 717_952


def test_a_verdict_on_a_running_grid_is_restated_as_what_its_runs_say_so_far() -> None:
    """The judgement moves behind "not yet decided" with its numbers kept; a grid whose runs hold
    no SeedFlood–DSGD cell yet says that, not "not yet run"."""
    partly = (
        "**Verdict: partly** (an incomplete grid; Welch): rte/ring: SeedFlood at 95.0% of DSGD."
    )
    assert so_far(partly) == (
        "**Verdict: not yet decided.** So far, on the runs made, partly (an incomplete grid; "
        "Welch): rte/ring: SeedFlood at 95.0% of DSGD."
    )
    untested = "**Verdict: not tested at this scale.** In every cell run, rte/ring (DSGD 44.0%)."
    assert so_far(untested) == (
        "**Verdict: not yet decided.** So far, on the runs made, not tested at this scale: "
        "in every cell run, rte/ring (DSGD 44.0%)."
    )
    none = main_verdict([{"method": "dsgd", "task": "rte", "topology": "ring"}], False, False)
    assert so_far(none) == (
        "**Verdict: not yet decided.** No task and topology has both SeedFlood and DSGD."
    )
