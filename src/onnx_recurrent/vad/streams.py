"""Streaming recordings through the Silero model: one stream, or many batched.

The model is called once per chunk of 512 samples (32 ms at 16 kHz) with the previous
chunk's last 64 samples in front and the recurrent ``state`` the previous call
returned. :func:`speech_probabilities` does this for one recording, as silero's
``OnnxWrapper`` does; :func:`stream_probabilities` advances many recordings together,
one call per chunk position for up to ``batch`` of them (the state's axis 1 is the
batch axis), recordings joining and leaving the batch as they start and end.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np

from .model import CHUNK_SAMPLES, CONTEXT_SAMPLES, STATE_SHAPE, input_names, native_rate

K = TypeVar("K")


def _progress_bar(total: int) -> Any:
    try:
        from tqdm import tqdm
    except ImportError as e:
        raise ImportError(
            "progress=True needs tqdm: pip install tqdm (or pip install 'onnx-recurrent[vad]')"
        ) from e
    return tqdm(total=total, unit="chunk", desc="VAD", leave=False)


def speech_probabilities(
    session: Any,
    samples: np.ndarray | Iterable[float],
    sample_rate: int = 16000,
    *,
    progress: bool = False,
) -> np.ndarray:
    """Run the streaming Silero VAD model over a whole recording.

    Mirrors silero's ``OnnxWrapper`` / ``get_speech_timestamps``: the audio is cut into
    chunks of 512 samples (256 at 8 kHz), the last one zero-padded; each model call
    gets the previous call's last 64 samples (32 at 8 kHz; zeros for the first chunk)
    in front of its chunk, so ``input`` has shape ``(1, 576)`` at 16 kHz, plus the
    ``state`` the previous call returned (zeros for the first chunk) and ``sr``.

    Parameters
    ----------
    session : object
        A session over the Silero model (e.g. from :func:`silero_model_path`) with
        onnxruntime's interface: ``session.run(None, feeds)`` returning
        ``[output, stateN]``, where ``feeds`` maps ``"input"`` to float32
        ``(1, context + chunk)``, ``"state"`` to float32 ``(2, 1, 128)`` and ``"sr"``
        to a 0-d int64 array. :class:`onnx_recurrent.InferenceSession` and
        :class:`onnxruntime.InferenceSession` both qualify. If the session has
        ``get_inputs()``, ``"sr"`` is fed only when the model declares it.
    samples : array_like of float
        The mono recording, shape ``(num_samples,)`` (size-1 axes are squeezed away),
        values in ``[-1, 1]``; converted to float32.
    sample_rate : int, default 16000
        Sample rate of ``samples`` in Hz: 8000, 16000, or a multiple of 16000 (then
        decimated to 16000 Hz by keeping every n-th sample, as silero does).
    progress : bool, default False
        Show a tqdm progress bar (on stderr), one step per chunk.

    Returns
    -------
    numpy.ndarray
        float32, shape ``(num_chunks,)`` with
        ``num_chunks = ceil(num_samples_at_model_rate / chunk)``: the speech
        probability of each chunk of 512 samples (32 ms at 16 kHz; 256 samples at
        8 kHz), in ``[0, 1]``. Empty for empty audio.

    Raises
    ------
    ValueError
        If ``samples`` is not one-dimensional, ``sample_rate`` is not supported, the
        session's model lacks the ``input``/``state`` inputs, or a call returns fewer
        than two outputs.
    ImportError
        If ``progress=True`` and tqdm is not installed.
    """
    audio = np.asarray(samples, dtype=np.float32)
    if audio.ndim > 1:
        audio = audio.squeeze()
    if audio.ndim != 1:
        raise ValueError(f"samples must be one-dimensional (mono), got shape {np.shape(samples)}")
    # one recording is a batch of one: the same calls, one per chunk
    model_rate, step = native_rate(sample_rate)
    feed_sr = _check_feeds(session)
    bar = (
        _progress_bar(math.ceil(audio[::step].size / CHUNK_SAMPLES[model_rate]))
        if progress
        else None
    )
    try:
        streams = _stream(
            session,
            iter([(0, audio)]),
            1,
            model_rate,
            step,
            feed_sr,
            None if bar is None else lambda seconds: bar.update(1),
        )
        ((_, probs),) = streams
    finally:
        if bar is not None:
            bar.close()
    return probs


def _check_feeds(session: Any) -> bool:
    """Check the model's inputs; return whether to feed ``sr``."""
    names = input_names(session)
    if names is not None and not {"input", "state"} <= names:
        raise ValueError(
            "the session's model is not the streaming Silero VAD model: it needs inputs "
            f"'input' and 'state' (and usually 'sr'), it has {sorted(names)}"
        )
    return names is None or "sr" in names


class _Stream:
    """One recording in the batch: its padded audio and where it has got to."""

    __slots__ = ("audio", "chunks", "key", "position", "probs", "waste")

    def __init__(self, key: Any, audio: np.ndarray, chunk: int, context: int) -> None:
        self.key = key
        self.chunks = math.ceil(audio.size / chunk)
        # Context zeros in front, the last chunk zero-padded: the model input at chunk
        # k is audio[k * chunk : k * chunk + context + chunk].
        self.audio = np.zeros(context + self.chunks * chunk, dtype=np.float32)
        self.audio[context : context + audio.size] = audio
        self.waste = self.chunks * chunk - audio.size  # padding samples
        self.position = 0
        self.probs = np.empty(self.chunks, dtype=np.float32)


def stream_probabilities(
    session: Any,
    recordings: Iterable[tuple[K, np.ndarray]],
    *,
    batch: int = 64,
    sample_rate: int = 16000,
    progress: Callable[[float], None] | None = None,
) -> Iterator[tuple[K, np.ndarray]]:
    """Run the streaming Silero VAD model over many recordings, batched.

    Up to ``batch`` recordings advance together, one model call per chunk position:
    ``input`` ``(rows, context + chunk)``, ``state`` ``(2, rows, 128)``. When a
    recording ends its row leaves the batch (the batch is compacted, not padded) and
    the next recording joins with a zero state, so each recording gets exactly the
    calls :func:`speech_probabilities` would make for it alone; the probabilities
    equal those (to float rounding, within 1e-5).

    Parameters
    ----------
    session : object
        A session over the Silero model with onnxruntime's ``run(None, feeds)``
        interface, accepting a batch axis (``onnx_recurrent.InferenceSession`` and
        ``onnxruntime.InferenceSession`` over ``silero_vad.onnx`` do).
    recordings : iterable of (key, array_like)
        ``(key, samples)`` pairs, the samples mono as for :func:`speech_probabilities`.
        Consumed lazily: the next one is taken only when a row is free, so a generator
        that decodes files keeps at most ``batch`` recordings in memory.
    batch : int, default 64
        The most recordings in one model call.
    sample_rate : int, default 16000
        Sample rate of every recording: 8000, 16000 or a multiple of 16000.
    progress : callable, optional
        Called after each model call with the seconds of audio it covered.

    Yields
    ------
    key : object
        The recording's key, as given.
    probs : numpy.ndarray
        float32, shape ``(num_chunks,)``: what :func:`speech_probabilities` returns
        for it. Recordings are yielded as they end (an empty one at once), so not
        necessarily in the order given.

    Raises
    ------
    ValueError
        If ``batch < 1``, ``sample_rate`` is not supported, a recording is not
        one-dimensional, or the model is not the streaming Silero model.
    """
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    model_rate, step = native_rate(sample_rate)
    feed_sr = _check_feeds(session)
    return _stream(session, iter(recordings), int(batch), model_rate, step, feed_sr, progress)


def _stream(
    session: Any,
    source: Iterator[tuple[K, np.ndarray]],
    batch: int,
    model_rate: int,
    step: int,
    feed_sr: bool,
    progress: Callable[[float], None] | None,
) -> Iterator[tuple[K, np.ndarray]]:
    chunk, context = CHUNK_SAMPLES[model_rate], CONTEXT_SAMPLES[model_rate]
    width = context + chunk
    hidden = STATE_SHAPE[2]
    sr = np.array(model_rate, dtype=np.int64)
    active: list[_Stream] = []
    state = np.zeros((STATE_SHAPE[0], 0, hidden), dtype=np.float32)
    exhausted = False
    while True:
        # Fill the free rows; an empty recording is done at once.
        joined = 0
        empty: list[tuple[K, np.ndarray]] = []
        while not exhausted and len(active) < batch:
            try:
                key, samples = next(source)
            except StopIteration:
                exhausted = True
                break
            audio = np.asarray(samples, dtype=np.float32)
            if audio.ndim > 1:
                audio = audio.squeeze()
            if audio.ndim != 1:
                raise ValueError(
                    f"recording {key!r}: samples must be one-dimensional (mono), "
                    f"got shape {np.shape(samples)}"
                )
            if step > 1:
                audio = audio[::step]
            if audio.size == 0:
                empty.append((key, np.empty(0, dtype=np.float32)))
                continue
            active.append(_Stream(key, audio, chunk, context))
            joined += 1
        yield from empty
        if not active:
            return
        if joined:
            fresh = np.zeros((STATE_SHAPE[0], joined, hidden), dtype=np.float32)
            state = np.concatenate((state, fresh), axis=1)

        rows = len(active)
        x = np.empty((rows, width), dtype=np.float32)
        for i, s in enumerate(active):
            start = s.position * chunk
            x[i] = s.audio[start : start + width]
        feeds = {"input": x, "state": state}
        if feed_sr:
            feeds["sr"] = sr
        outputs = session.run(None, feeds)
        if len(outputs) < 2:
            raise ValueError(
                f"the session returned {len(outputs)} output(s); the Silero model "
                "returns two (output, stateN)"
            )
        probs = np.asarray(outputs[0], dtype=np.float32).reshape(rows, -1)[:, 0]
        state = np.asarray(outputs[1], dtype=np.float32)
        if state.shape != (STATE_SHAPE[0], rows, hidden):
            raise ValueError(
                f"the model returned a state of shape {state.shape} for {rows} streams; "
                f"expected {(STATE_SHAPE[0], rows, hidden)}"
            )

        finished = []
        covered = rows * chunk
        for i, s in enumerate(active):
            s.probs[s.position] = probs[i]
            s.position += 1
            if s.position == s.chunks:
                finished.append(s)
                covered -= s.waste
        if progress is not None:
            progress(covered / model_rate)
        if finished:
            keep = [i for i, s in enumerate(active) if s.position < s.chunks]
            active = [active[i] for i in keep]
            state = state[:, keep, :]
            for s in finished:
                yield s.key, s.probs
