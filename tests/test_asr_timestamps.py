"""Timestamps: segments from Whisper's timestamp tokens, words by DTW over the alignment heads'
cross-attention. References: OpenAI's whisper itself (``test_asr_openai_words.json``, made by
``benchmarks/asr_openai_reference.py`` with openai-whisper 20250625 on the same converted
weights), transformers' ``return_token_timestamps``, and a DTW written out here."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from speechctl.api import AsrJob
from speechctl.asr.options import WhisperOptions
from test_asr_reference import RATE, speech_clips

ROOT = Path(__file__).parent.parent
OPENAI = json.loads((Path(__file__).parent / "test_asr_openai_words.json").read_text())
# What the fixture ran: whisper.transcribe(language="en", temperature=0.0, word_timestamps=True,
# condition_on_previous_text=False), other settings OpenAI's defaults.
LIKE_OPENAI = dict(temperatures=(0.0,), condition_on_previous_text=False, word_timestamps=True)


def plain_dtw(x: np.ndarray):
    """OpenAI's ``dtw_cpu`` and ``backtrace``, cell by cell."""
    N, M = x.shape
    cost = np.full((N + 1, M + 1), np.inf)
    trace = -np.ones((N + 1, M + 1))
    cost[0, 0] = 0
    for j in range(1, M + 1):
        for i in range(1, N + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t
    i, j = N, M
    trace[0, :] = 2
    trace[:, 0] = 1
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        i, j = (i - 1, j - 1) if t == 0 else (i - 1, j) if t == 1 else (i, j - 1)
    return np.array(path[::-1]).T


def test_dtw_is_openai_dtw_ties_included():
    from speechctl.asr.timing import dtw

    rng = np.random.default_rng(0)
    for shape in [(1, 1), (1, 7), (6, 1), (5, 40), (23, 150)]:
        for x in (rng.normal(size=shape), rng.integers(0, 3, size=shape).astype(float)):  # the second is full of ties
            ours = dtw(x)
            expected = plain_dtw(x)
            assert np.array_equal(ours[0], expected[0]) and np.array_equal(ours[1], expected[1]), shape


def test_segments_from_timestamp_tokens():
    from speechctl.asr.segments import Window
    from speechctl.asr.transcript import token_segments
    from speechctl.asr.vocab import WhisperVocab

    v = WhisperVocab(eot=50256, sot=50257, sot_prev=50360, no_speech=50361, no_timestamps=50362, transcribe=None,
                     translate=None, languages={}, vocab_size=51864, suppress=(), begin_suppress=(), alignment_heads=())
    t = lambda s: v.timestamp_begin + round(s / 0.02)  # noqa: E731
    window = Window(start=10 * RATE, end=20 * RATE, speech_start=10 * RATE, speech_end=19 * RATE)
    decode = lambda ids: " ".join(str(i) for i in ids)  # noqa: E731
    two = token_segments([t(0), 1, 2, t(1.5), t(2.0), 3, t(4.0)], v, window, decode)
    assert [(s.start, s.end, s.text) for s in two] == [(10.0, 11.5, "1 2"), (12.0, 14.0, "3")]
    # text after the last pair: OpenAI re-decodes from there; speechctl ends it with the window's speech
    tail = token_segments([t(0), 1, t(1.5), t(2.0), 3, 4], v, window, decode)
    assert [(s.start, s.end, s.text) for s in tail] == [(10.0, 11.5, "1"), (12.0, 19.0, "3 4")]
    one = token_segments([t(0.4), 5, 6, t(3.0)], v, window, decode)
    assert [(s.start, s.end, s.text) for s in one] == [(10.4, 13.0, "5 6")]
    assert [s.text for s in token_segments([t(0), t(1.0), 7], v, window, decode)] == ["", "7"]


def test_token_times_agree_with_transformers():
    """transformers' ``return_token_timestamps`` on its own greedy tokens against the alignment
    pass on the same tokens. transformers leaves the <|notimestamps|> row out of the DTW, so its
    time for token i is, by construction, OpenAI's start of token i+1 (its first text token is
    always 0.0): compare those, for every token but the first and the last. The two matrices still
    differ (transformers' has one row less and does not renormalise the attention over the
    frames that hold audio), so this is a closeness check: the median difference is one frame
    (20 ms) or less, and most tokens are within 0.1 s."""
    import torch
    from transformers import AutoTokenizer, WhisperFeatureExtractor, WhisperForConditionalGeneration

    from speechctl.asr.checkpoint import ensure_whisper
    from speechctl.asr.timing import TOKENS_PER_SECOND, Aligner, AlignItem, token_frames
    from speechctl.asr.vocab import load_vocab

    path = ensure_whisper()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    vocab = load_vocab(path, tokenizer)
    aligner = Aligner(path, vocab, tokenizer, "cpu", torch.float32)
    model = WhisperForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()
    features = WhisperFeatureExtractor.from_pretrained(str(path))
    diffs = []
    for name, audio in speech_clips(range(1, 13)).items():
        f = features(audio, sampling_rate=RATE, return_tensors="pt", return_attention_mask=True)
        with torch.no_grad():
            out = model.generate(f.input_features, attention_mask=f.attention_mask, return_token_timestamps=True,
                                 return_dict_in_generate=True, max_new_tokens=100)
        seq, theirs = out["sequences"][0].tolist(), out["token_timestamps"][0].numpy()
        text = [t for t in seq if t < vocab.eot]
        begin = seq.index(text[0])
        ((weights, _),) = aligner.attention([AlignItem(audio, text, [vocab.sot], "en")])
        rows, frames = token_frames(weights, len(audio) // 160, 1)
        starts = frames[np.pad(np.diff(rows), (1, 0), constant_values=1).astype(bool)] / TOKENS_PER_SECOND
        ours_next = starts[2 : len(text)]  # start of token i+1, for i = 1 .. T-2
        diffs.extend(np.abs(ours_next - theirs[begin + 1 : begin + len(text) - 1]))
    diffs = np.array(diffs)
    assert len(diffs) > 80
    assert np.median(diffs) <= 0.02 + 1e-6 and np.mean(diffs <= 0.1) >= 0.85, (np.median(diffs), np.mean(diffs <= 0.1))


@pytest.fixture(scope="module")
def asr():
    from speechctl.cli.options import EngineChoice

    return EngineChoice(None, 64, 4096, "auto").whisper()  # the engine the CLI commands of this process use too


@pytest.mark.engine
@pytest.mark.parametrize("mode", ["greedy", "beam5"])
def test_words_within_a_tenth_of_a_second_of_openai_whisper(asr, mode):
    """OpenAI's ``transcribe(word_timestamps=True)`` on the same input (each window's audible
    part, transformers' log-mel; see the fixture's script), greedy and beam 5, timestamps on:
    every clip and every window of the 70 s file has OpenAI's tokens, the same words, and each
    word's and segment's start and end within 0.1 s of OpenAI's (they are equal here)."""
    clips = speech_clips()
    gap = np.zeros(4800, np.float32)
    clips["long"] = np.concatenate([x for c in list(clips.values()) for x in (c, gap)])  # three windows
    options = WhisperOptions(beam_size=1 if mode == "greedy" else 5, **LIKE_OPENAI)
    ours = {r.id: r for r in asr.run(AsrJob(id=n, audio=a, whisper=options) for n, a in clips.items())}
    windows = [(n, [n]) for n in clips if n != "long"] + [("long", [f"long{k}" for k in range(len(ours["long"].tokens))])]
    compared, worst = 0, 0.0
    for name, keys in windows:
        theirs = [s for k in keys for s in OPENAI[f"{mode}/{k}"]]
        if [t for s in theirs for t in s["tokens"]] != [t for tokens in ours[name].tokens for t in tokens]:
            continue
        compared += 1
        our_words = [w for s in ours[name].segments for w in s.words]
        their_words = [w for s in theirs for w in s["words"]]
        assert [w.word for w in our_words] == [w["word"] for w in their_words], name
        for a, b in zip(our_words, their_words):
            worst = max(worst, abs(a.start - b["start"]), abs(a.end - b["end"]))
        for a, b in zip(ours[name].segments, theirs):
            worst = max(worst, abs(a.start - b["start"]), abs(a.end - b["end"]))
    print(f"\n{mode}: {compared} of {len(windows)} inputs with OpenAI's tokens, largest word/segment time difference {worst:.3f} s")
    assert compared >= 23  # (all 25 here: the same input, the same tokens)
    assert worst <= 0.1


@pytest.mark.engine
def test_word_timestamps_in_json_srt_and_vtt(asr, tmp_path):
    from speechctl.cli import cli

    flac = str(ROOT / "samples" / "asr" / "22.flac")
    run = lambda *args: CliRunner().invoke(cli, list(args), catch_exceptions=False)  # noqa: E731
    (row,) = json.loads(run("asr", flac, "--format", "json", "--word-timestamps").stdout)
    words = [w for s in row["segments"] for w in s["words"]]
    assert "".join(w["word"] for w in words).strip() == row["text"] and row["language"] == "en"
    assert all(a["end"] <= b["start"] + 1e-9 for a, b in zip(words, words[1:]))
    assert all(0 <= w["probability"] <= 1 and w["start"] <= w["end"] <= row["duration"] for w in words)
    srt = run("asr", flac, "--format", "srt", "--word-timestamps").stdout
    first = srt.split("\n\n")[0].splitlines()
    assert first[0] == "1" and first[1].startswith("00:00:00,") and all(len(line) <= 42 for line in srt.splitlines())
    start = float(first[1].split(" --> ")[0].split(":")[-1].replace(",", "."))
    assert start == pytest.approx(words[0]["start"], abs=1e-3)
    vtt = run("asr", flac, "--format", "vtt", "--word-timestamps").stdout
    assert vtt.startswith("WEBVTT\n\n") and vtt.count("<00:00:0") >= len(words) - vtt.count(" --> ")
    plain = run("asr", flac, "--format", "srt").stdout
    assert plain.count(" --> ") == len(row["segments"])  # without words: a cue per segment
