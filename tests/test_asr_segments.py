"""Long-audio windows and transcript formats (no model: fast)."""

import json

import numpy as np
import pytest

from speechctl.asr.segments import (
    FRAME,
    MAX_SECONDS,
    RATE,
    Segment,
    frame_rms,
    plan_windows,
    render,
    to_srt,
    to_vtt,
)


def burst(seconds, rng, level=0.3):
    """Speech-like noise: an audible burst of ``seconds``."""
    return (rng.normal(0, level, int(seconds * RATE))).astype(np.float32)


def test_frame_rms_matches_the_definition():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 0.1, 1000).astype(np.float32)
    rms = frame_rms(x)
    assert len(rms) == 7  # 6 full frames of 160 and a zero-padded tail of 40
    np.testing.assert_allclose(rms[0], np.sqrt(np.mean(x[:160].astype(np.float64) ** 2)), rtol=1e-5)
    np.testing.assert_allclose(rms[6], np.sqrt(np.sum(x[960:].astype(np.float64) ** 2) / 160), rtol=1e-5)


def test_short_audio_is_one_window_and_silence_is_none():
    rng = np.random.default_rng(1)
    audio = np.concatenate([np.zeros(RATE, np.float32), burst(2.0, rng), np.zeros(RATE // 2, np.float32)])
    (w,) = plan_windows(audio)
    assert (w.start, w.end) == (0, len(audio))
    # the audible part is the burst, padded by 0.1 s
    assert abs(w.speech_start - (RATE - RATE // 10)) <= FRAME
    assert abs(w.speech_end - (3 * RATE + RATE // 10)) <= FRAME
    assert plan_windows(np.zeros(5 * RATE, np.float32)) == []
    assert plan_windows(np.full(RATE, 1e-4, np.float32)) == []  # -80 dBFS: silence


def test_long_audio_is_cut_in_the_pauses():
    """Bursts of 1.5-7 s separated by pauses of 0.15-0.8 s, 3 minutes long: every cut falls in a
    pause, windows tile the input, none is longer than 30 s."""
    rng = np.random.default_rng(2)
    parts, pauses = [], []
    pos = 0
    while pos < 180 * RATE:
        b = burst(rng.uniform(1.5, 7.0), rng)
        gap = np.zeros(int(rng.uniform(0.15, 0.8) * RATE), np.float32)
        parts += [b, gap]
        pauses.append((pos + len(b), pos + len(b) + len(gap)))
        pos += len(b) + len(gap)
    audio = np.concatenate(parts)
    windows = plan_windows(audio)
    assert len(windows) >= 6
    assert windows[0].start == 0 and windows[-1].end == len(audio)
    for a, b in zip(windows, windows[1:]):
        assert a.end == b.start
        assert any(s <= a.end <= e for s, e in pauses), f"cut at {a.end / RATE:.2f} s is inside a burst"
    assert all(w.end - w.start <= MAX_SECONDS * RATE for w in windows)


def test_without_pauses_the_cut_takes_the_quietest_dip():
    rng = np.random.default_rng(3)
    audio = burst(50.0, rng)
    dip = slice(int(21.0 * RATE), int(21.3 * RATE))
    audio[dip] *= 0.05
    windows = plan_windows(audio)
    assert len(windows) == 2
    assert dip.start <= windows[0].end <= dip.stop


def test_max_window_is_respected_and_bounded():
    rng = np.random.default_rng(4)
    audio = burst(40.0, rng)
    windows = plan_windows(audio, max_seconds=10.0)
    assert len(windows) >= 4 and all(w.end - w.start <= 10 * RATE for w in windows)
    with pytest.raises(ValueError):
        plan_windows(audio, max_seconds=1.0)


def test_an_hour_of_mostly_silence_plans_fast_and_keeps_only_the_speech():
    """One hour (57.6 M samples; untouched zero pages cost no memory) with three bursts: only
    the windows around the bursts are kept."""
    rng = np.random.default_rng(5)
    audio = np.zeros(3600 * RATE, np.float32)
    starts = [60.0, 1800.0, 3590.0]
    for s in starts:
        audio[int(s * RATE) : int((s + 3) * RATE)] = burst(3.0, rng)
    windows = plan_windows(audio)
    assert len(windows) == 3
    for w, s in zip(windows, starts):
        assert abs(w.speech_start / RATE - (s - 0.1)) < 0.02
        assert abs(w.speech_end / RATE - (s + 3.1)) < 0.02


def test_srt_vtt_and_json():
    segments = [Segment(0.0, 2.5, "Hello there."), Segment(3.0, 3723.456, ("A much longer line " * 4).strip()), Segment(4.0, 5.0, "")]
    srt = to_srt(segments)
    assert srt.startswith("1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n2\n00:00:03,000 --> 01:02:03,456\n")
    assert all(len(line) <= 42 for line in srt.splitlines())
    assert srt.count("-->") == 2  # empty segments make no cue
    vtt = to_vtt(segments)
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there.\n")
    record = json.loads(render("json", "Hello there.", segments, "a.wav", 3.5))
    assert record["file"] == "a.wav" and record["duration"] == 3.5
    assert [s["text"] for s in record["segments"]] == ["Hello there.", ("A much longer line " * 4).strip()]
    assert render("txt", "Hello.", segments) == "Hello.\n"


def test_a_speech_lm_transcript_is_one_cue_over_its_audio():
    """A speech LM's ASR result has no timestamps: its subtitle is one cue from 0 to the audio's
    length (the CLI and the batch runner alike); Whisper's segments are its own."""
    from speechctl.asr.segments import result_segments
    from speechctl.jobs import AsrResult

    (cue,) = result_segments(AsrResult("a", " hello there ", duration=2.5))
    assert (cue.start, cue.end, cue.text) == (0.0, 2.5, "hello there")
    assert to_srt([cue]) == "1\n00:00:00,000 --> 00:00:02,500\nhello there\n\n"
    own = [Segment(1.0, 2.0, "hi")]
    assert result_segments(AsrResult("w", "hi", segments=own, duration=9.0)) is own


def test_a_failed_asr_job_still_reports_its_input_length():
    """The CLI's json rows take the duration from the result, failed or not (it kept its own
    table of read files beside the results)."""
    from speechctl.jobs import AsrJob, TtsJob, failure

    failed = failure(AsrJob(id="a", audio=np.zeros(24_000, np.float32)), "a: too long", 16_000)
    assert (failed.error, failed.duration) == ("a: too long", 1.5)
    assert failure(AsrJob(id="e", audio=np.zeros(0, np.float32)), "e: empty audio", 16_000).duration is None
    assert failure(TtsJob(id="t", text="hi"), "t: bad", 16_000).audio is None
