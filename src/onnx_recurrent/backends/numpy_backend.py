"""The NumPy backend: each step is the cell's own NumPy step (one BLAS call with R)."""

from __future__ import annotations

import numpy as np


class NumpyBackend:
    name = "numpy"
    calls_blas = True  # NumPy products: BLAS kept to one thread when ours split the work

    def supports(self, spec, dtype) -> str | None:
        return None

    def run_block(self, spec, w, acts, xb, states, active, Yb, shared=None, step0=0) -> None:
        cell = spec.cell
        xw = w.project(xb, states[0].dtype)[..., : w.W.shape[0]]
        work = cell.workspace(spec, xw.shape[1], xw.dtype)
        for k, n in enumerate(active.tolist()):
            cell.step(spec, w, acts, xw[k, :n], tuple(s[:n] for s in states), work)
            if Yb is not None:
                np.copyto(Yb[k, :n], states[0][:n])


BACKEND = NumpyBackend()
