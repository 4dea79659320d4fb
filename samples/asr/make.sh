#!/bin/sh
# Regenerate the ASR test set in samples/asr/ (run from anywhere; needs espeak-ng and the venv):
#   sudo apt-get install -y espeak-ng && samples/asr/make.sh
# Writes 16 kHz mono FLAC, 8-bit to keep the set small (quantisation noise ~45 dB below the
# speech peaks: no transcript depends on it):
#   NN.flac      line NN of sentences.txt, spoken by espeak-ng 1.51 (voice and speed below)
#   silence.flac 3 s of digital silence
#   noise.flac   3 s of white noise (numpy seed 0, standard deviation 0.05)
# The exact espeak-ng command of every clip is printed, and kept in commands.txt.
set -eu
cd "$(dirname "$0")"
PY=${PYTHON:-../../.venv/bin/python}
VOICES="en-us en-gb en-gb-x-rp en-us+m3"
SPEEDS="150 165 140 175 155 160"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: > commands.txt
n=0
while IFS= read -r sentence; do
    n=$((n + 1))
    voice=$(echo $VOICES | cut -d' ' -f$(( (n - 1) % 4 + 1 )))
    speed=$(echo $SPEEDS | cut -d' ' -f$(( (n - 1) % 6 + 1 )))
    name=$(printf '%02d' "$n")
    set -- espeak-ng -v "$voice" -s "$speed" -w "$tmp/$name.wav" "$sentence"
    echo "$name.flac: espeak-ng -v $voice -s $speed \"$sentence\"" | tee -a commands.txt
    "$@"
done < sentences.txt
"$PY" - "$tmp" <<'PY'
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

rate = 16000
for wav in sorted(Path(sys.argv[1]).glob("*.wav")):
    audio, sr = sf.read(wav, dtype="float32")
    sf.write(f"{wav.stem}.flac", soxr.resample(audio, sr, rate, quality="HQ"), rate, subtype="PCM_S8")
sf.write("silence.flac", np.zeros(3 * rate, dtype=np.float32), rate, subtype="PCM_S8")
noise = np.random.default_rng(0).normal(0.0, 0.05, 3 * rate).astype(np.float32)
sf.write("noise.flac", noise, rate, subtype="PCM_S8")
PY
