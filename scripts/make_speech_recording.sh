#!/usr/bin/env bash
# Make tests/data/speech_16k.wav, the short English recording the Silero VAD
# end-to-end test runs on (tests/test_silero_vad.py).
#
# Layout: 0.75 s silence, sentence one, 1 s silence, sentence two, 0.75 s silence.
# Format: 16 kHz, mono, 16-bit signed PCM WAV, about 5 s (about 160 KB).
#
# Needs espeak-ng and sox (Debian: apt-get update && apt-get install -y espeak-ng sox).
# The result is committed; run this only to remake it. Dithering is switched off
# (sox -D) so the same espeak-ng/sox versions give the same bytes.
#
# Usage: scripts/make_speech_recording.sh [OUTPUT_WAV]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$(dirname "$here")/tests/data/speech_16k.wav}"

for tool in espeak-ng sox; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "error: $tool not found (Debian: apt-get install -y espeak-ng sox)" >&2
        exit 1
    fi
done

SENTENCE_1="The sun is shining today."
SENTENCE_2="Let us go outside."
RATE=16000
EDGE_SILENCE_S=0.75  # before the first and after the last sentence
GAP_SILENCE_S=1.0    # between the sentences

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

fmt=(-r "$RATE" -c 1 -b 16 -e signed-integer)

# Speak each sentence, convert to 16 kHz mono 16-bit, and trim espeak-ng's own
# leading/trailing silence so the silences below are the ones that count.
i=0
for text in "$SENTENCE_1" "$SENTENCE_2"; do
    i=$((i + 1))
    espeak-ng -v en-us -s 175 -w "$tmp/raw$i.wav" "$text"
    sox -D -V1 "$tmp/raw$i.wav" "${fmt[@]}" "$tmp/s$i.wav" \
        silence 1 0.01 0.1% reverse silence 1 0.01 0.1% reverse
done

sox -D -V1 -n "${fmt[@]}" "$tmp/edge.wav" trim 0 "$EDGE_SILENCE_S"
sox -D -V1 -n "${fmt[@]}" "$tmp/gap.wav" trim 0 "$GAP_SILENCE_S"

mkdir -p "$(dirname "$out")"
sox -D -V1 "$tmp/edge.wav" "$tmp/s1.wav" "$tmp/gap.wav" "$tmp/s2.wav" "$tmp/edge.wav" \
    "${fmt[@]}" "$out"

echo "wrote $out: $(soxi -D "$out") s, $(stat -c %s "$out") bytes"
