"""SubCGE: subspace canonical-basis directions, one (row, column, sign) per weight matrix.

For every weight matrix W (m × n_in) and subspace epoch e = ⌊t / T⌋ all clients derive the same
orthonormal basis V_e (n_in × r). A seed picks one (row, column, sign) per matrix, so u restricted
to W is √(m·r) · sign · e_row V_e[:, col]ᵀ and E[u uᵀ] is the projector onto {A V_eᵀ}. A message
touches one row per matrix: O(Σ n_in) instead of the dense direction's O(d).
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from seedflood.zo.seeds import Update, derive_seed, message_generator
from seedflood.zo.views import CHUNK, Region, Touch, chunks


class DirectionError(ValueError):
    """A direction the model cannot have (a SubCGE rank above a matrix's input width): the
    user's setting, reported like a config error."""


def trainable_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The 2-D weights of the linear layers inside the transformer blocks, in module order.

    Embeddings, the (tied) head and norms stay frozen under SubCGE: the method's subspace is
    defined for weight matrices.
    """
    return [
        module.weight
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and ".layers." in f".{name}."
    ]


@dataclass
class Terms:
    """K SubCGE updates as arrays, in the order they apply: per matrix and update the row, basis
    column and sign its seed picks (``rows``, ``cols``, ``signs``: matrices × K), and per update
    its coefficient (float64) and epoch. A walk of the shared weights applies hundreds of
    thousands of updates a round this way, with no Python object per update. All but the epochs
    live where the matrices are; the epochs stay on the CPU, which groups updates by them
    without waiting for a GPU."""

    rows: torch.Tensor
    cols: torch.Tensor
    signs: torch.Tensor
    coefs: torch.Tensor
    epochs: torch.Tensor

    def __len__(self) -> int:
        return len(self.coefs)

    def __getitem__(self, part: slice | torch.Tensor) -> Terms:
        """The updates ``part`` (a slice, or indices in order) picks."""
        return Terms(
            self.rows[:, part],
            self.cols[:, part],
            self.signs[:, part],
            self.coefs[part],
            self.epochs[part],
        )


class SubCGEDirection:
    """Subspace canonical-basis directions: one (row, column, sign) per weight matrix."""

    name = "subcge"

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The tensors these directions change, in a fixed order: what a state hash covers."""
        return list(self.matrices)

    def __init__(
        self,
        matrices: Sequence[nn.Parameter],
        *,
        rank: int,
        refresh: int,
        run_seed: int,
        names: Sequence[str] | None = None,
    ) -> None:
        if not matrices:
            raise ValueError("subcge needs at least one weight matrix to train")
        narrowest = min(range(len(matrices)), key=lambda i: matrices[i].shape[1])
        smallest = matrices[narrowest].shape[1]
        if rank < 1 or rank > smallest:
            # V_e has n_in rows and rank orthonormal columns: more columns than rows do not exist.
            name = names[narrowest] if names is not None else f"#{narrowest}"
            rows, cols = matrices[narrowest].shape
            raise DirectionError(
                f"key 'rank': rank must be between 1 and the smallest matrix input dimension "
                f"({smallest}); got {rank}. Matrix {name} has shape {rows}x{cols}, and SubCGE's "
                f"basis for it has rank orthonormal columns of length {cols}: "
                f"set rank <= {smallest}"
            )
        if refresh < 1:
            raise ValueError(f"refresh must be at least 1 step; got {refresh}")
        self.matrices = [w.data for w in matrices]
        self.rank = rank
        self.refresh = refresh
        self.run_seed = run_seed
        self.rows_per_matrix = torch.tensor(
            [w.shape[0] for w in matrices], dtype=torch.long, device="cpu"
        )
        self.scales = [math.sqrt(w.shape[0] * rank) for w in matrices]
        # Entering a view, applying and committing all need the same messages' coordinates.
        self.coordinates = functools.lru_cache(maxsize=1 << 14)(self._coordinates)
        self._bases: OrderedDict[int, list[torch.Tensor]] = OrderedDict()

    def epoch(self, step: int) -> int:
        return step // self.refresh

    def basis(self, epoch: int) -> list[torch.Tensor]:
        """V_e for every matrix: orthonormal columns, the same on every client.

        Two epochs stay cached because late messages of the previous epoch can still arrive.
        """
        if epoch not in self._bases:
            bases = []
            for index, w in enumerate(self.matrices):
                generator = torch.Generator().manual_seed(
                    derive_seed(self.run_seed, "basis", epoch, index)
                )
                gaussian = torch.randn(w.shape[1], self.rank, generator=generator, device="cpu")
                basis, _ = torch.linalg.qr(gaussian)
                bases.append(basis.to(dtype=w.dtype, device=w.device).T.contiguous())
            self._bases[epoch] = bases
            while len(self._bases) > 2:
                self._bases.popitem(last=False)
        return self._bases[epoch]

    def _coordinates(self, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row, column and sign (±1) per matrix, all drawn from one seed on the CPU (the same on
        every device) and kept there: callers gather many updates' coordinates into arrays and
        move those to the matrices' device in one copy (`terms`), not three small copies per
        seed, each of which would wait for the GPU's queue to drain."""
        draws = message_generator(seed).integers(0, 1 << 62, (len(self.matrices), 3))
        raw = torch.from_numpy(draws)
        rows = raw[:, 0] % self.rows_per_matrix
        cols = raw[:, 1] % self.rank
        signs = (raw[:, 2] % 2) * 2 - 1
        return rows, cols, signs

    def touch(self, seed: int, step: int) -> Touch:
        rows, cols, signs = self.coordinates(seed)
        basis = self.basis(self.epoch(step))
        views, values = [], []
        for w, v, scale, row, col, sign in zip(
            self.matrices,
            basis,
            self.scales,
            rows.tolist(),
            cols.tolist(),
            signs.tolist(),
            strict=True,
        ):
            views.append(w[row])
            values.append(v[col] * (scale * sign))
        return Touch(views, values)

    def region(self, updates: Sequence[Update]) -> Region:
        """The rows of each matrix that any of the updates touches."""
        if not updates:
            return Region([], [])
        return self.rows_region(
            torch.stack([self.coordinates(seed)[0] for seed, _, _ in chunk], dim=1)
            for chunk in chunks(updates)
        )

    def rows_region(self, blocks: Iterable[torch.Tensor]) -> Region:
        """The rows of each matrix that any block (rows per matrix, matrices × K, on the CPU)
        names, found on the CPU and moved to the matrices' device once."""
        touched = [torch.zeros(len(w), dtype=torch.bool, device="cpu") for w in self.matrices]
        for rows in blocks:
            for mask, matrix_rows in zip(touched, rows, strict=True):
                mask[matrix_rows] = True
        found = [mask.nonzero().flatten() for mask in touched]
        sizes = [len(rows) for rows in found]
        if not any(sizes):  # saving and restoring nothing still costs two operations per matrix
            return Region([], [])
        moved = torch.cat(found).to(self.matrices[0].device).split(sizes)
        return Region(list(self.matrices), list(moved))

    def terms(self, updates: Sequence[Update]) -> Terms:
        """``updates`` as arrays, their coordinates drawn (or taken from the cache) seed by seed
        on the CPU and moved to the matrices' device in one copy; epochs stay on the CPU, where
        `_scatters` reads them."""
        device = self.matrices[0].device
        if not updates:
            empty = torch.zeros(len(self.matrices), 0, dtype=torch.long, device=device)
            coefs = torch.zeros(0, dtype=torch.float64, device=device)
            return Terms(empty, empty, empty, coefs, torch.zeros(0, dtype=torch.long, device="cpu"))
        coords = [self.coordinates(seed) for seed, _, _ in updates]
        rows, cols, signs = (
            torch.stack([torch.stack([c[part] for c in coords], dim=1) for part in range(3)])
            .to(device)
            .unbind()
        )
        return Terms(
            rows=rows,
            cols=cols,
            signs=signs,
            coefs=torch.tensor([c for _, _, c in updates], dtype=torch.float64, device="cpu").to(
                device
            ),
            epochs=torch.tensor([self.epoch(step) for _, step, _ in updates], device="cpu"),
        )

    def _scatters(
        self, terms: Terms
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per chunk, epoch and matrix: (matrix, basis, rows, columns, factors) of the terms, in
        order. A factor is coef · sign · √(m·r): the update adds factor · V_e[:, column] to the row.
        Chunks and epochs fix the order in which updates of two epochs reach a row, so every way of
        applying the same updates (a list or arrays, in one call or chunk by chunk) rounds alike.
        """
        scales = torch.tensor(self.scales, dtype=torch.float64, device="cpu")[:, None]
        for start in range(0, len(terms), CHUNK):
            chunk = terms[start : start + CHUNK]
            epochs = chunk.epochs.unique().tolist()
            for epoch in epochs:
                part = chunk if len(epochs) == 1 else chunk[(chunk.epochs == epoch).nonzero()[:, 0]]
                factors = part.coefs * part.signs * scales.to(part.coefs.device)
                cast = {dtype: factors.to(dtype) for dtype in {w.dtype for w in self.matrices}}
                basis = self.basis(epoch)
                for index, (w, v) in enumerate(zip(self.matrices, basis, strict=True)):
                    yield w, v, part.rows[index], part.cols[index], cast[w.dtype][index]

    def apply(self, updates: Sequence[Update]) -> None:
        """Apply (seed, step, coef) updates in the given order (see `apply_terms`)."""
        for chunk in chunks(updates):
            self.apply_terms(self.terms(chunk))

    def apply_terms(self, terms: Terms) -> None:
        """Apply updates in their order as one scatter per matrix (a few on a GPU, see
        `add_rows_in_order`), so the result equals applying them one by one: O(K · Σ n_in).

        The rows V_e[:, column] are gathered with ``index_select`` and scaled in place: advanced
        indexing and a second product cost four times the scatter itself when a walk applies a
        thousand updates to every matrix (benchmarks/scale.py at 1,024 clients).
        """
        for w, v, rows, cols, factors in self._scatters(terms):
            add_rows_in_order(w, rows, v.index_select(0, cols).mul_(factors[:, None]))

    def apply_merged(self, updates: Sequence[Update]) -> None:
        """Apply many updates as one accumulation and one product per matrix (see
        `apply_terms_merged`): O(K + r·d), the cheaper path when K is large.

        Its rounding differs from ``apply``; all clients of a run must use the same path.
        """
        for chunk in chunks(updates):
            self.apply_terms_merged(self.terms(chunk))

    def apply_terms_merged(self, terms: Terms) -> None:
        """Apply updates as one accumulation of their factors into A (m × r, float64) and one
        product W += A V_e per matrix and epoch: O(K + m·r·n_in) whatever K. A walk of the
        shared weights by a quarter of a million updates (the first client's model at 1,024
        clients with hops = 1) then costs about one pass over the weights, where applying the
        updates in order costs one pass per thousand of them.

        The sums are formed in another order than `apply_terms`, so the two agree to rounding
        only. A is accumulated on the CPU, whose ``index_add_`` adds in index order: the same
        sums on every run and device.
        """
        scales = torch.tensor(self.scales, dtype=torch.float64, device="cpu")
        rows, cols, signs, coefs = (
            t.cpu() for t in (terms.rows, terms.cols, terms.signs, terms.coefs)
        )
        for epoch in terms.epochs.unique().tolist():
            picked = (terms.epochs == epoch).nonzero()[:, 0]
            epoch_coefs = coefs[picked]
            for index, (w, v) in enumerate(zip(self.matrices, self.basis(epoch), strict=True)):
                factors = epoch_coefs * signs[index, picked] * scales[index]
                coefficients = torch.zeros(
                    w.shape[0] * self.rank, dtype=torch.float64, device="cpu"
                )
                coefficients.index_add_(
                    0, rows[index, picked] * self.rank + cols[index, picked], factors
                )
                w.addmm_(coefficients.view(-1, self.rank).to(w.device, w.dtype), v)


IN_ORDER_ROWS = 16
"""The most indices one CUDA ``index_add_`` adds in their order: up to 16, each thread adds every
index's value to its elements in turn; above, threads race with atomic adds, and two updates of
one row would be summed in no fixed order."""


def add_rows_in_order(matrix: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> None:
    """``matrix[rows[i]] += values[i]`` for i in order, on every device. The CPU's ``index_add_``
    adds in index order; on a GPU the scatter goes IN_ORDER_ROWS indices at a time, so a commit
    rounds as the CPU's does, and alike on every GPU peer, whatever the number of clients."""
    size = len(rows) if matrix.device.type == "cpu" else IN_ORDER_ROWS
    for start in range(0, len(rows), max(size, 1)):
        matrix.index_add_(0, rows[start : start + size], values[start : start + size])
