"""Feeds for a model: read from ``.npy`` files or drawn at random for its declared inputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from onnx.helper import tensor_dtype_to_np_dtype

from ..errors import RecurrentError
from .session import NodeArg


def parse_pairs(pairs: Sequence[str], option: str) -> dict[str, str]:
    """``["a=1", "b=x.npy"]`` as a dict; a clear error for an item without ``=``."""
    parsed = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name or not value:
            raise RecurrentError(f"{option} expects NAME=VALUE, got {pair!r}")
        parsed[name] = value
    return parsed


def load_feeds(files: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Load one ``.npy`` file per input name."""
    feeds = {}
    for name, path in files.items():
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise RecurrentError(f"input {name!r}: cannot read {path!r}: {e}") from None
    return feeds


def random_feeds(
    inputs: Sequence[NodeArg], dims: Mapping[str, int], seed: int = 0
) -> dict[str, np.ndarray]:
    """Seeded standard-normal float arrays for the given inputs.

    Named dims take their value from ``dims``, else 1 for a name containing "batch"
    and 8 for any other free dim.

    Raises
    ------
    ValueError
        An input of a non-float type (its values cannot be guessed).
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in inputs:
        dtype = np.dtype(tensor_dtype_to_np_dtype(arg.elem_type))
        if dtype.kind != "f" and dtype.name != "bfloat16":
            raise RecurrentError(
                f"input {arg.name!r} is {arg.type}: its values cannot be drawn at random; "
                f"give it as -i {arg.name}=FILE.npy"
            )
        shape = []
        for d in arg.shape or []:
            if isinstance(d, int) and d > 0:
                shape.append(d)
            elif isinstance(d, str) and d in dims:
                shape.append(int(dims[d]))
            else:
                shape.append(1 if isinstance(d, str) and "batch" in d.lower() else 8)
        feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
    return feeds
