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
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np

from ...errors import import_optional
from .model import (
    CHUNK_SAMPLES,
    CONTEXT_SAMPLES,
    INSTALL_EXTRA,
    MAX_SAMPLE_PEAK,
    STATE_SHAPE,
    input_names,
    native_rate,
    peak_past_bound,
)

K = TypeVar("K")


def _progress_bar(total: int) -> Any:
    tqdm = import_optional("tqdm", "progress=True", f"pip install tqdm (or {INSTALL_EXTRA})")
    return tqdm.tqdm(total=total, unit="chunk", desc="VAD", leave=False)


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
        values in ``[-1, 1]`` (a peak past :data:`MAX_SAMPLE_PEAK` is refused);
        converted to float32.
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
        If ``samples`` is not one-dimensional, holds a NaN or infinity (the model's
        state would be NaN from there on: "no speech" to the end) or integers past
        [-1, 1] or floats past :data:`MAX_SAMPLE_PEAK` (PCM: divide int16 by 32768),
        ``sample_rate`` is not supported, the session's model lacks the
        ``input``/``state`` inputs, or a call returns fewer than two outputs.
    TypeError
        If ``samples`` are not numbers, or ``session`` has no ``run``.
    ImportError
        If ``progress=True`` and tqdm is not installed.
    """
    audio = as_samples(samples, "samples")
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


def as_samples(value: Any, what: str) -> np.ndarray:
    """``value`` as float32 samples, or an error naming ``what``: not numbers, integer
    PCM (amplitudes past 1, where the model reads floats in [-1, 1]), or floats on the
    PCM scale (:func:`check_peak`)."""
    array = np.asarray(value)
    if array.dtype.kind not in "fiub":
        raise TypeError(f"{what} must be numbers, got dtype {array.dtype}")
    if array.dtype.kind in "iu" and array.size and (array.max() > 1 or array.min() < -1):
        raise ValueError(
            f"{what} are integers from {array.min()} to {array.max()} (PCM, as int16 holds "
            "it): "
            "give floats in [-1, 1], e.g. samples / 32768 for int16"
        )
    if array.dtype.kind == "f":
        check_peak(array, what)
    return array.astype(np.float32, copy=False)


def check_peak(samples: np.ndarray, what: str) -> None:
    """Refuse float ``samples`` whose peak magnitude is past :data:`MAX_SAMPLE_PEAK`
    (PCM values as floats, ``x * 32768``: the model would take them as [-1, 1] audio).

    Raises
    ------
    ValueError
        Naming ``what``, the peak, the bound and the fix (divide by 32768).
    """
    peak = peak_past_bound(samples)
    if peak is not None:
        raise ValueError(
            f"{what} peak at {peak:g}, past {MAX_SAMPLE_PEAK:g} (full scale is 1): floats "
            "on the int16 scale, it seems; give floats in [-1, 1], e.g. samples / 32768"
        )


def _check_feeds(session: Any) -> bool:
    """Check the model's inputs; return whether to feed ``sr``."""
    if not callable(getattr(session, "run", None)):
        raise TypeError(
            "session must have onnxruntime's interface (session.run(None, feeds)), got "
            f"{type(session).__name__}"
        )
    names = input_names(session)
    if names is not None and not {"input", "state"} <= names:
        raise ValueError(
            "the session's model is not the streaming Silero VAD model: it needs inputs "
            f"'input' and 'state' (and usually 'sr'), it has {sorted(names)}"
        )
    return names is None or "sr" in names


def _fixed_batch(session: Any) -> int | None:
    """The batch size the model declares as a number (``input``'s axis 0, ``state``'s
    axis 1; ``silero_vad_openvino_16k.onnx`` fixes 1), else None."""
    try:
        shapes = {i.name: list(i.shape or ()) for i in session.get_inputs()}
    except Exception:  # an unusual session object: no batch declared
        return None
    sizes = [
        shape[axis]
        for name, axis in (("input", 0), ("state", 1))
        for shape in [shapes.get(name, [])]
        if len(shape) > axis and isinstance(shape[axis], int) and shape[axis] > 0
    ]
    return min(sizes) if sizes else None


#: Chunks of an array recording taken into a stream's buffer at a time.
_ARRAY_BLOCK_CHUNKS = 64


def _blocks(key: Any, samples: Any) -> Iterator[np.ndarray]:
    """A recording's samples as blocks: an iterator's as they come, an array's as views.

    Raises
    ------
    ValueError
        If an array recording is not one-dimensional.
    """
    if isinstance(samples, Iterator):
        return samples
    audio = as_samples(samples, f"recording {key!r}: samples")
    if audio.ndim > 1:
        audio = audio.squeeze()
    if audio.ndim != 1:
        raise ValueError(
            f"recording {key!r}: samples must be one-dimensional (mono), "
            f"got shape {np.shape(samples)}"
        )
    size = _ARRAY_BLOCK_CHUNKS * CHUNK_SAMPLES[16000]
    return (audio[i : i + size] for i in range(0, audio.size, size))


class _Stream:
    """One recording in the batch: the part of its audio not yet consumed.

    ``buffer[offset : offset + context + chunk]`` is the model's next input: the
    previous chunk's last ``context`` samples (zeros before the first chunk), then the
    next chunk, zero-padded at the end of the recording. The blocks are pulled as they
    are needed, so a stream holds about one block, whatever the recording's length.
    """

    __slots__ = (
        "blocks",
        "buffer",
        "chunk",
        "context",
        "key",
        "offset",
        "phase",
        "probs",
        "pulled",
        "step",
        "waste",
    )

    def __init__(
        self, key: Any, blocks: Iterator[np.ndarray], chunk: int, context: int, step: int
    ) -> None:
        self.key = key
        self.blocks: Iterator[np.ndarray] | None = blocks
        self.chunk, self.context, self.step = chunk, context, step
        self.buffer = np.zeros(context, dtype=np.float32)
        self.offset = 0
        self.phase = 0  # decimating blocks: the first sample of the next one to keep
        self.waste = 0  # padding samples in the current input
        self.pulled = 0  # samples of the recording pulled so far
        self.probs = array("f")

    def _next_block(self) -> np.ndarray | None:
        assert self.blocks is not None
        block = next(self.blocks, None)
        if block is None:
            self.close()
            return None
        block = as_samples(block, "a block of samples")
        if block.ndim != 1 and sum(n != 1 for n in block.shape) <= 1:
            block = block.reshape(-1)  # (n, 1) or (1, n): one channel
        if block.ndim != 1:
            raise ValueError(
                f"recording {self.key!r}: a block of samples must be one-dimensional "
                f"(mono), got shape {block.shape}"
            )
        if not np.isfinite(block).all():  # a NaN state from there on: no speech, silently
            at = self.pulled + int(np.argmin(np.isfinite(block)))
            rate = self.step * next(r for r, n in CHUNK_SAMPLES.items() if n == self.chunk)
            raise ValueError(  # the caller pairs it with the recording (file or key)
                f"samples must be finite, got {block[at - self.pulled]} at {at / rate:.3f} s "
                f"(sample {at} at {rate} Hz)"
            )
        self.pulled += block.size
        if self.step > 1:  # keep every step-th sample of the recording, as silero does
            kept = block[self.phase :: self.step]
            self.phase = (self.phase - block.size) % self.step
            block = kept
        return block

    def fill(self) -> bool:
        """Make the next model input ready; False when the recording has ended.

        Raises whatever pulling the next block raises (the recording's own failure).
        """
        width = self.context + self.chunk
        while self.buffer.size - self.offset < width and self.blocks is not None:
            block = self._next_block()
            if block is not None and block.size:
                self.buffer = np.concatenate((self.buffer[self.offset :], block))
                self.offset = 0
        left = self.buffer.size - self.offset
        if left >= width:
            return True
        if left <= self.context:
            return False
        self.waste = width - left
        self.buffer = np.concatenate(
            (self.buffer[self.offset :], np.zeros(self.waste, dtype=np.float32))
        )
        self.offset = 0
        return True

    def result(self) -> np.ndarray:
        """float32 ``(num_chunks,)``: the probabilities of the chunks so far."""
        return np.frombuffer(self.probs, dtype=np.float32)

    def close(self) -> None:
        """Let go of the blocks (closing their source if it can be closed)."""
        blocks, self.blocks = self.blocks, None
        close = getattr(blocks, "close", None)
        if close is not None:
            close()


def stream_probabilities(
    session: Any,
    recordings: Iterable[tuple[K, Any]],
    *,
    batch: int = 64,
    sample_rate: int = 16000,
    progress: Callable[[float], None] | None = None,
    return_errors: bool = False,
) -> Iterator[tuple[K, np.ndarray | Exception]]:
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
    recordings : iterable of (key, array_like or iterator of arrays)
        ``(key, samples)`` pairs, the samples mono: an array as for
        :func:`speech_probabilities`, or an iterator of 1-D blocks of samples (any
        sizes, e.g. an :class:`~onnx_recurrent.tools.vad.audio.AudioReader`), pulled as the
        stream needs them, so that a recording is never held whole (an iterator with
        a ``close`` method is closed when its recording ends or fails). Consumed
        lazily: the next recording is taken only when a row is free, so at most
        ``batch`` recordings are open at once, each holding about one block.
    batch : int, default 64
        The most recordings in one model call (fewer where the model fixes its batch
        size: ``silero_vad_openvino_16k.onnx`` takes one recording a call).
    sample_rate : int, default 16000
        Sample rate of every recording: 8000, 16000 or a multiple of 16000.
    progress : callable, optional
        Called after each model call with the seconds of audio it covered.
    return_errors : bool, default False
        A recording whose blocks raise an ``Exception`` (a file that fails to decode
        halfway, a ``MemoryError``): if True, it leaves the batch and is yielded as
        ``(key, exception)``, the others go on; if False, the exception propagates.

    Yields
    ------
    key : object
        The recording's key, as given.
    probs : numpy.ndarray or Exception
        float32, shape ``(num_chunks,)``: what :func:`speech_probabilities` returns
        for it (or, with ``return_errors``, the exception that made it fail).
        Recordings are yielded as they end (an empty one at once), so not
        necessarily in the order given.

    Raises
    ------
    ValueError
        If ``batch < 1``, ``sample_rate`` is not supported, a recording is not
        one-dimensional, holds a NaN or infinity, integers past [-1, 1] or floats
        past :data:`MAX_SAMPLE_PEAK` (unless ``return_errors``), or the model is not
        the streaming Silero model.
    """
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    model_rate, step = native_rate(sample_rate)
    feed_sr = _check_feeds(session)
    fixed = _fixed_batch(session)
    return _stream(
        session,
        iter(recordings),
        int(batch) if fixed is None else min(int(batch), fixed),
        model_rate,
        step,
        feed_sr,
        progress,
        return_errors=bool(return_errors),
    )


def _stream(
    session: Any,
    source: Iterator[tuple[K, Any]],
    batch: int,
    model_rate: int,
    step: int,
    feed_sr: bool,
    progress: Callable[[float], None] | None,
    *,
    return_errors: bool = False,
) -> Iterator[tuple[K, Any]]:
    chunk, context = CHUNK_SAMPLES[model_rate], CONTEXT_SAMPLES[model_rate]
    width = context + chunk
    hidden = STATE_SHAPE[2]
    sr = np.array(model_rate, dtype=np.int64)
    active: list[_Stream] = []
    state = np.zeros((STATE_SHAPE[0], 0, hidden), dtype=np.float32)
    exhausted = False
    try:
        while True:
            # Fill the free rows; an empty recording is done at once.
            joined = 0
            done: list[tuple[K, Any]] = []
            while not exhausted and len(active) < batch:
                try:
                    key, samples = next(source)
                except StopIteration:
                    exhausted = True
                    break
                stream = None
                try:
                    stream = _Stream(key, _blocks(key, samples), chunk, context, step)
                    started = stream.fill()
                except Exception as e:
                    if stream is not None:
                        stream.close()
                    if not return_errors:
                        raise
                    done.append((key, e))
                    continue
                if not started:
                    done.append((key, stream.result()))
                    continue
                active.append(stream)
                joined += 1
            yield from done
            if not active:
                return
            if joined:
                fresh = np.zeros((STATE_SHAPE[0], joined, hidden), dtype=np.float32)
                state = np.concatenate((state, fresh), axis=1)

            rows = len(active)
            x = np.empty((rows, width), dtype=np.float32)
            covered = rows * chunk
            for i, s in enumerate(active):
                x[i] = s.buffer[s.offset : s.offset + width]
                covered -= s.waste
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
                    f"the model returned a state of shape {state.shape} for {rows} "
                    f"streams; expected {(STATE_SHAPE[0], rows, hidden)}"
                )
            if progress is not None:
                progress(covered / model_rate)

            keep: list[int] = []
            done = []
            for i, (s, p) in enumerate(zip(active, probs.tolist(), strict=True)):
                s.probs.append(p)
                s.offset += chunk
                if s.buffer.size - s.offset >= width:  # the next input is there
                    keep.append(i)
                    continue
                try:
                    going = s.fill()
                except Exception as e:
                    s.close()
                    if not return_errors:
                        raise
                    done.append((s.key, e))
                    continue
                if going:
                    keep.append(i)
                else:
                    done.append((s.key, s.result()))
            if len(keep) < rows:
                active = [active[i] for i in keep]
                state = state[:, keep, :]
                yield from done
    finally:  # ended, failed or closed early: close the recordings still open
        for s in active:
            s.close()
