"""The tools on top of the library: each imports the library, the library none of them.

* :mod:`~onnx_recurrent.tools.cli`: the ``onnx-recurrent`` command;
  :mod:`~onnx_recurrent.tools.arguments`, the options its subcommands share;
* :mod:`~onnx_recurrent.tools.check`: one model on onnx-recurrent and every installed
  peer, compared, linted, traced;
* :mod:`~onnx_recurrent.tools.bench`: the benchmark (cases, competitors, timing, report);
* :mod:`~onnx_recurrent.tools.vad`: Silero VAD over many recordings, in this process or on
  a Dask cluster;
* :mod:`~onnx_recurrent.tools.dask`: any model over Dask arrays chunked on the batch axis;
  :mod:`~onnx_recurrent.tools.workers`, the sessions both Dask tools keep on a worker.

Each is loaded only when used. The paths from before the tools moved here
(``onnx_recurrent.vad``, ``.dask``, ``.check``, ``.bench``, ``.cli``) still import: they
are the same module objects as these, submodules included.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

#: the subcommands, as :data:`.cli.COMMANDS` lists them (named here without importing it)
_COMMANDS = ("run", "check", "bench", "vad")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``onnx-recurrent``: :func:`.cli.main`, imported inside Ctrl-C's
    one line (``interrupted``, status 130). A Ctrl-C while the command's modules
    loaded (onnx alone takes 0.4 s with ml_dtypes 0.7), or while its parser was built,
    printed Python's traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args if not a.startswith("-")), None)
    prog = "onnx-recurrent" + (f" {command}" if command in _COMMANDS else "")
    try:
        from .cli import main as command_line

        return command_line(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
