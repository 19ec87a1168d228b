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
