"""Silero voice-activity detection (VAD): where people speak in many recordings.

A tool of the package: it uses the library (:class:`onnx_recurrent.InferenceSession`
computes the model's LSTM nodes), the library never imports it. The
`silero-vad <https://pypi.org/project/silero-vad/>`_ package ships its model as ONNX
(``silero_vad/data/silero_vad.onnx``: opset 16, two ``LSTM`` nodes inside ``If``
branches), but its own Python helpers need torch. This package redoes, on NumPy, the
parts that surround the model, and runs it over many files:

* :func:`detect` finds the speech segments of audio files and directories, in this
  process (:func:`detect_files`, batched) or on a Dask cluster (``client=``,
  :mod:`onnx_recurrent.tools.vad.cluster`);
  ``onnx-recurrent vad`` is its command line (:mod:`onnx_recurrent.tools.vad.command`);
* :func:`open_audio` reads WAV, FLAC or OGG at any rate (from
  :data:`MIN_SAMPLE_RATE`) and channel count as 16 kHz mono, block by block in bounded
  memory (soundfile, soxr), :func:`read_audio` a whole recording; :func:`read_wav`
  reads mono 16-bit WAV with the standard library;
* :func:`speech_probabilities` streams one recording through the model chunk by chunk
  the way silero's ``OnnxWrapper`` does, through any session object with
  onnxruntime's ``run(None, feeds)`` interface; :func:`stream_probabilities` streams
  many together, batched, arrays or blocks as they are decoded;
* :func:`speech_segments` turns per-chunk probabilities into speech segments with
  silero's ``get_speech_timestamps`` algorithm, option names and defaults;
* :func:`silero_model_path` finds the model file of an installed ``silero-vad``.

Install the model without torch: ``pip install --no-deps silero-vad``; the audio
readers, progress bars, plots and Dask come with ``pip install 'onnx-recurrent[vad]'``
(imported only when used).

Examples
--------
>>> import onnx_recurrent
>>> from onnx_recurrent import vad
>>> for path, found in vad.detect(["speech_16k.wav", "calls/"]):  # doctest: +SKIP
...     print(path, found)
speech_16k.wav [(0.738, 2.206), (3.074, 4.222)]
>>> session = onnx_recurrent.InferenceSession(vad.silero_model_path())  # doctest: +SKIP
>>> samples, rate = vad.read_wav("speech_16k.wav")  # doctest: +SKIP
>>> probs = vad.speech_probabilities(session, samples, rate)  # doctest: +SKIP
>>> vad.speech_segments(probs, rate, num_samples=samples.size)  # doctest: +SKIP
[(0.738, 2.206), (3.074, 4.222)]
"""

from __future__ import annotations

from .audio import (
    AUDIO_SUFFIXES,
    MIN_SAMPLE_RATE,
    Audio,
    AudioError,
    AudioReader,
    find_audio_files,
    open_audio,
    read_audio,
    read_wav,
)
from .detect import detect
from .files import FileResult, analyse_files, detect_files
from .model import (
    CHUNK_SAMPLES,
    CONTEXT_SAMPLES,
    MAX_SAMPLE_PEAK,
    MODEL_RATE,
    STATE_SHAPE,
    silero_model_path,
)
from .segments import SEGMENT_OPTIONS, speech_segments
from .streams import speech_probabilities, stream_probabilities

__all__ = [
    "AUDIO_SUFFIXES",
    "CHUNK_SAMPLES",
    "CONTEXT_SAMPLES",
    "MAX_SAMPLE_PEAK",
    "MIN_SAMPLE_RATE",
    "MODEL_RATE",
    "SEGMENT_OPTIONS",
    "STATE_SHAPE",
    "Audio",
    "AudioError",
    "AudioReader",
    "FileResult",
    "analyse_files",
    "detect",
    "detect_files",
    "find_audio_files",
    "open_audio",
    "read_audio",
    "read_wav",
    "silero_model_path",
    "speech_probabilities",
    "speech_segments",
    "stream_probabilities",
]
