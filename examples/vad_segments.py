"""Print the speech segments of a WAV file with the Silero VAD model.

Usage::

    python examples/vad_segments.py WAV [--runtime onnx-recurrent|onnxruntime]
                                        [--host auto|onnxruntime|reference]

The WAV file must be mono 16-bit PCM at 8000 Hz, 16000 Hz or a multiple of 16000 Hz
(convert others with ``sox IN -r 16000 -c 1 -b 16 OUT.wav``). The model comes from the
silero-vad package: ``pip install --no-deps silero-vad`` (no torch needed). By default it
runs on ``onnx_recurrent.InferenceSession`` (``--host`` picks who runs the graph's
other nodes, as for ``onnx-recurrent run``); ``--runtime onnxruntime`` runs the same
streaming loop on onnxruntime instead. Recordings longer than ``--progress-after``
seconds get a tqdm progress bar on stderr.

Example output::

    $ python examples/vad_segments.py tests/data/speech_16k.wav
    tests/data/speech_16k.wav: 4.95 s, 16000 Hz, 155 chunks (onnx-recurrent, onnxruntime)
    0.738 - 2.206 s
    3.074 - 4.222 s
"""

from __future__ import annotations

import argparse
import sys

from onnx_recurrent import vad


def make_session(runtime: str, model_path: str, host: str = "auto"):
    """Return a session over the model on the chosen runtime."""
    if runtime == "onnxruntime":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # the model's unused initializers only warn
        return onnxruntime.InferenceSession(
            model_path, options, providers=["CPUExecutionProvider"]
        )
    import onnx_recurrent

    return onnx_recurrent.InferenceSession(model_path, host=host)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wav", help="mono 16-bit PCM WAV file")
    parser.add_argument(
        "--runtime",
        choices=["onnx-recurrent", "onnxruntime"],
        default="onnx-recurrent",
        help="which runtime runs the model (default: onnx-recurrent)",
    )
    parser.add_argument(
        "--host",
        choices=["auto", "onnxruntime", "reference"],
        default="auto",
        help="onnx-recurrent's graph host (default: auto, onnxruntime where it can)",
    )
    parser.add_argument(
        "--threshold", type=float, default=0.5, help="speech probability threshold (0.5)"
    )
    parser.add_argument(
        "--progress-after",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="show a progress bar for recordings longer than this (default: 10)",
    )
    args = parser.parse_args(argv)

    try:
        model_path = vad.silero_model_path()
        samples, rate = vad.read_wav(args.wav)
    except (ImportError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    duration = samples.size / rate
    session = make_session(args.runtime, str(model_path), args.host)
    try:
        probs = vad.speech_probabilities(
            session, samples, rate, progress=duration > args.progress_after
        )
    except (ImportError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    segments = vad.speech_segments(probs, rate, num_samples=samples.size, threshold=args.threshold)

    runtime = args.runtime if args.runtime == "onnxruntime" else f"{args.runtime}, {session.host}"
    print(f"{args.wav}: {duration:.2f} s, {rate} Hz, {probs.size} chunks ({runtime})")
    if not segments:
        print("no speech found")
    for start, end in segments:
        print(f"{start:.3f} - {end:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
