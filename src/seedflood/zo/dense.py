"""MeZO's dense direction: u ~ N(0, I_d) over every trainable parameter, drawn from the message's
own generator in canonical parameter order. Applying one message costs O(d)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from seedflood.zo.seeds import Update, message_generator
from seedflood.zo.views import Region, Touch


class DenseDirection:
    """MeZO's Gaussian direction over every trainable parameter."""

    name = "dense"

    def __init__(self, params: Sequence[nn.Parameter]) -> None:
        self.params = list(params)

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The tensors these directions change, in a fixed order: what a state hash covers."""
        return [p.data for p in self.params]

    def touch(self, seed: int, step: int) -> Touch:
        values = [torch.empty(p.shape, dtype=p.dtype, device="cpu") for p in self.params]
        self.draw_into(seed, values)
        return Touch(
            [p.data for p in self.params],
            [v.to(p.device) for v, p in zip(values, self.params, strict=True)],
        )

    def draw_into(self, seed: int, outs: Sequence[torch.Tensor]) -> None:
        """Fill ``outs`` (contiguous fp32 CPU tensors shaped like the parameters, in order) with u
        for ``seed``. The draw is on the CPU whatever the parameters' device, so a seed means one
        direction on every device; callers that step often pass reused buffers instead of fresh
        ones."""
        generator = message_generator(seed)
        for out in outs:
            generator.standard_normal(dtype=np.float32, out=out.view(-1).numpy())

    def apply(self, updates: Sequence[Update]) -> None:
        """Apply (seed, step, coef) updates in the given order."""
        for seed, step, coef in updates:
            self.touch(seed, step).add_(coef)

    def region(self, updates: Sequence[Update]) -> Region:
        return Region([p.data for p in self.params], [None] * len(self.params))
