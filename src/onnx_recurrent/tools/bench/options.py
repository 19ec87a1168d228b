"""What one run measures and how: :class:`Options`, filled by the command line from its
arguments and taken by the Python API."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any

from .cases import DEFAULT_BUDGET, OPS, SHAPES, Case, make_cases, parse_list
from .models import MODEL_BUDGET, REFERENCE_REPEATS, ModelCase, make_model_cases

#: the operator bench's competitors besides ours, in the column order
COMPETITORS = ("layer", "session", "onnxruntime", "openvino", "reference")
#: ours under each host (whole models)
MODEL_OURS = ("ours-onnxruntime", "ours-reference")
#: the whole-model runtimes, ours included, in the column order
MODEL_RUNTIMES = (*MODEL_OURS, "onnxruntime", "openvino", "reference")
#: options of single operators only (and their flags)
OPERATOR_ONLY = ("ops", "shapes", "skip_reference", "opset", "background_load")


@dataclass(frozen=True)
class Options:
    """One run's options (``onnx-recurrent bench [models] --help`` says each one).

    ``models``: whole models (:mod:`.models`) instead of single operators.
    ``ops``, ``shapes``, ``runtimes`` and ``skip_reference`` take names or one
    comma-separated text; ``runtimes``: the competitors besides ours (operators, default
    :data:`COMPETITORS`) or every runtime, ours included (models, default
    :data:`MODEL_RUNTIMES`). ``repeat`` fixes the timed rounds, else they fit ``budget``
    seconds in all (default: :data:`~.cases.DEFAULT_BUDGET` per shape, or
    :data:`~.models.MODEL_BUDGET` per model). ``select``: only the cases whose label
    contains it (``-k``). ``reference_repeats`` (models): at most that many timed calls
    of onnx.reference (0 or None: no cap). ``settle``: the pause after each call until
    no thread spins. Times in seconds.

    Raises ValueError on an unknown name, an operator option given with ``models``, no
    one of ours among the models' runtimes, or a ``select`` that matches no case.
    """

    models: bool = False
    ops: tuple[str, ...] = OPS
    shapes: tuple[str, ...] = ("step", "S", "M")
    runtimes: tuple[str, ...] | None = None
    repeat: int | None = None
    budget: float | None = None
    warmup: int = 1
    threads: int | None = None
    skip_reference: tuple[str, ...] = ()
    reference_limit: float = 30.0
    reference_repeats: int | None = REFERENCE_REPEATS
    select: str | None = None
    seed: int = 0
    opset: int = 22
    order: str = "alternate"
    settle: bool = True
    background_load: int = 0

    def __post_init__(self) -> None:
        allowed = MODEL_RUNTIMES if self.models else COMPETITORS
        for name, choices, what in (
            ("ops", OPS, "op"),
            ("shapes", SHAPES, "shape"),
            ("runtimes", allowed, "runtime"),
            ("skip_reference", SHAPES, "shape"),
        ):
            value = getattr(self, name)
            text = value if value is None or isinstance(value, str) else ",".join(value)
            # no competitor (ours alone) and no shape skipped may be given as nothing
            empty = name == "skip_reference" or (name == "runtimes" and not self.models)
            if text is not None:
                names = () if empty and not text.strip() else parse_list(text, choices, what)
                object.__setattr__(self, name, tuple(names))
        object.__setattr__(self, "reference_repeats", self.reference_repeats or None)
        if self.order not in ("alternate", "blocks"):
            raise ValueError(f"order must be 'alternate' or 'blocks', not {self.order!r}")
        if self.models:
            default = Options()
            given = [n for n in OPERATOR_ONLY if getattr(self, n) != getattr(default, n)]
            if given:
                names = ", ".join("--" + n.replace("_", "-") for n in given)
                raise ValueError(f"--models does not take {names}")
            if not set(self.runtime_names) & set(MODEL_OURS):
                raise ValueError(f"--models needs one of ours: {', '.join(MODEL_OURS)}")
        if self.select and not self.cases():
            hint = "bench models --list" if self.models else "--list"
            raise ValueError(f"-k {self.select!r} matches no case ({hint} shows them)")

    @property
    def runtime_names(self) -> tuple[str, ...]:
        """``runtimes``, or the default of the run's kind."""
        if self.runtimes is not None:
            return self.runtimes
        return MODEL_RUNTIMES if self.models else COMPETITORS

    def cases(self) -> list[Case] | list[ModelCase]:
        """The run's cases, in order."""
        if self.models:
            return make_model_cases(self.select)
        cases = make_cases(self.ops, self.shapes)
        select = (self.select or "").lower()
        return [c for c in cases if select in c.key.lower()]

    def budgets(self, cases: list[Any]) -> dict[str, float]:
        """Seconds for each group of cases (a shape; the models are one group)."""
        if self.models:
            return {"": MODEL_BUDGET * len(cases) if self.budget is None else self.budget}
        return budgets(self.shapes, self.budget)

    def to_json(self) -> dict[str, Any]:
        """The options of the run's kind, as the JSON output saves them."""
        left_out = OPERATOR_ONLY if self.models else ("models", "reference_repeats")
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in left_out}
        out["runtimes"] = self.runtime_names
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        """The options that ``args`` (the ``bench`` parser's) has, by name."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


def budgets(shapes: Any, total: float | None) -> dict[str, float]:
    """Each shape's share of the time budget (the defaults, scaled to ``total``)."""
    default = {s: DEFAULT_BUDGET[s] for s in shapes}
    if total is None:
        return default
    whole = sum(default.values())
    if whole <= 0:
        return {s: total / len(shapes) for s in shapes}
    return {s: total * v / whole for s, v in default.items()}
