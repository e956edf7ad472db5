"""Who takes part in a real run: every member ever admitted, by client index, with the steps it
takes part in. Every peer holds the same roster at the steps it commits (`seedflood.peers.state`
says how admissions and departures reach all of them first), so all expect the same messages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

Control = dict[str, Any]
"""An admission or departure record as a message carries it."""


@dataclass
class Seat:
    """One member of the run: its peer id, the steps it takes part in, and the public key
    (hex) its batches are signed with ("" until known)."""

    peer_id: str
    first_step: int
    gone_from: int | None = None
    key: str = ""

    def expected_at(self, step: int) -> bool:
        return self.first_step <= step and (self.gone_from is None or step < self.gone_from)


class Members:
    """Every member ever admitted, by client index; persisted beside the log."""

    def __init__(self, seats: dict[int, Seat]) -> None:
        self.seats = dict(seats)

    @classmethod
    def initial(cls, peer_ids: Sequence[str], keys: Sequence[str] = ()) -> Members:
        keys = list(keys) or [""] * len(peer_ids)
        return cls(
            {i: Seat(p, 0, key=k) for i, (p, k) in enumerate(zip(peer_ids, keys, strict=True))}
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Members:
        return cls({int(index): Seat(**seat) for index, seat in data.items()})

    def to_json(self) -> dict[str, Any]:
        return {str(index): asdict(seat) for index, seat in sorted(self.seats.items())}

    def expected(self, step: int) -> list[int]:
        return sorted(i for i, seat in self.seats.items() if seat.expected_at(step))

    def last_step_passed(self, before: int, after: int) -> bool:
        """Whether some removed member's last step lies in (``before``, ``after``]."""
        return any(
            s.gone_from is not None and before < s.gone_from - 1 <= after
            for s in self.seats.values()
        )

    def next_index(self) -> int:
        return max(self.seats, default=-1) + 1

    def depart(self, index: int, from_step: int) -> bool:
        seat = self.seats.get(index)
        if seat is None or (seat.gone_from is not None and seat.gone_from <= from_step):
            return False
        seat.gone_from = from_step
        return True


def admitted(control: Control) -> Seat:
    return Seat(control["peer"], control["first_step"], key=str(control.get("key", "")))
