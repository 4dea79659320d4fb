"""``speechctl chat``: one turn from a file with the embedded default models (Whisper tiny.en,
tiny-lm, tiny), and the live loop driven through the queue audio device: an empty utterance is
skipped, new speech during a reply stops its playback (barge-in), Ctrl-C exits cleanly. No sound
hardware is touched; ``sounddevice`` only ever appears as a fake module here."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from speechctl.cli import cli

SAMPLES = Path(__file__).parent.parent / "samples"
RATE = 16000
pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("engines_of_this_module")]


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def one_line_error(result, fragment):
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert result.exit_code != 0 and len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert fragment in lines[0], lines[0]


def hello() -> np.ndarray:
    audio, rate = sf.read(SAMPLES / "hello.wav", dtype="float32")  # espeak-ng: "hello world"
    assert rate == RATE
    return audio





QUICK = ["--max-reply-tokens", "40", "--max-seconds", "0.6", "--seed", "1"]


def test_chat_answers_a_recording_with_the_default_models(tmp_path):
    """The README's `speechctl chat --input q.wav --output a.wav`, out of the box."""
    out = tmp_path / "a.wav"
    result = run("chat", "--input", str(SAMPLES / "hello.wav"), "--output", str(out), *QUICK)
    assert result.exit_code == 0, result.stderr
    audio, rate = sf.read(out)
    assert rate == RATE and audio.ndim == 1 and len(audio) > 0
    assert "you: " in result.stderr and "reply: " in result.stderr and "first audio" in result.stderr
    assert "hello" in result.stderr.lower() or "world" in result.stderr.lower()  # Whisper heard it


def test_chat_unified_mode_answers_in_audio(tmp_path):
    out = tmp_path / "u.wav"
    result = run("chat", "--mode", "unified", "--input", str(SAMPLES / "hello.wav"), "--output", str(out), *QUICK)
    assert result.exit_code == 0, result.stderr
    audio, rate = sf.read(out)
    assert rate == RATE and len(audio) > 0


def test_chat_usage_errors_are_one_line(tmp_path):
    quiet = tmp_path / "quiet.wav"
    sf.write(quiet, np.zeros(RATE, np.float32), RATE)
    one_line_error(run("chat", "--input", str(quiet), "--output", str(tmp_path / "x.wav")), "no speech")
    one_line_error(run("chat", "--output", str(tmp_path / "x.wav")), "--output needs --input")
    one_line_error(run("chat", "--input", str(tmp_path / "missing.wav")), "no such file")
    one_line_error(run("chat", "--input", str(quiet), "--output", str(tmp_path / "x.mp3")), ".mp3")
    assert not (tmp_path / "x.wav").exists()


# -- the live loop, scripted --------------------------------------------------------------------


def silence(seconds):
    return np.zeros(int(seconds * RATE), np.float32)


def blocks(audio, ms=10):
    from speechctl.audio.devices import blocks_of

    return list(blocks_of(audio, RATE, ms))


@pytest.fixture(scope="module")
def pipeline():
    from speechctl.cli.options import EngineChoice
    from speechctl.pipeline.build import ChatConfig, build_pipeline
    from speechctl.pipeline.lm import LmConfig

    speech = EngineChoice(None, 64, 4096, "auto").speech()  # the CLI's tiny: shared with this module's CLI calls
    config = ChatConfig(lm=LmConfig(max_tokens=96, min_tokens=96, seed=0), tts_options=dict(seed=2, max_seconds=0.6))
    return build_pipeline(speech, config)


def test_live_loop_skips_an_empty_utterance_and_barges_in(pipeline):
    """Script: a click (too short: skipped, no reply), "hello world" (answered; we speak again
    while its reply plays: playback stops, the turn is marked interrupted), "hello world"
    (answered in full). 10 ms microphone blocks: playback (virtual time, one block per round)
    is slower than generation, so a reply is still playing when the second utterance starts."""
    from speechctl.audio.devices import QueueAudio
    from speechctl.pipeline.chat import ChatLoop
    from speechctl.pipeline.vad import VadConfig

    click = (0.5 * np.random.default_rng(0).standard_normal(int(0.12 * RATE))).astype(np.float32)
    events = []
    device = None

    def microphone():
        yield from blocks(np.concatenate([silence(0.3), click, silence(0.6), hello(), silence(0.3)]))
        for _ in range(3000):  # silence until the reply is being heard, then speak over it
            if device.heard > 0 and device.queued_samples() > RATE // 5:
                break
            yield silence(0.01)
        else:
            raise AssertionError("the first reply never started playing")
        events.append(("speaking over the reply", device.queued_samples()))
        yield from blocks(np.concatenate([hello(), silence(1.5)]))

    device = QueueAudio(microphone(), RATE, RATE)
    vad = VadConfig(threshold_db=-40, silence_ms=400, min_speech_ms=250)
    loop = ChatLoop(pipeline, device, vad, on_event=lambda kind, value: events.append((kind, value)))
    turns = loop.run()
    kinds = [k for k, _ in events]

    assert [(t.skipped, t.interrupted) for t in turns] == [(True, False), (False, True), (False, False)]
    skipped, interrupted, answered = turns
    assert skipped.pipeline_turn is None and skipped.reply_samples == 0  # no reply at all
    assert kinds.index("skipped") < kinds.index("transcript")
    # barge-in: playback stopped with audio still queued, the reply's generation was cut short
    assert device.stops == 1 and device.dropped > 0
    assert kinds.index("speaking over the reply") < kinds.index("barge-in")
    assert interrupted.pipeline_turn.cancelled
    # the last turn: heard, answered, its whole reply played
    assert "hello" in answered.transcript.lower() or "world" in answered.transcript.lower()
    assert answered.reply and answered.reply_samples > 0 and answered.first_audio_s is not None
    times = answered.pipeline_turn.times
    assert times["tts"].first_out < times["lm"].last_out  # speaking before the reply was written
    played = sum(len(a) for a in device.played)
    assert device.heard + device.dropped == played and not device.playing()
    assert not pipeline.busy() and pipeline.stages[-1].streamer.engine.scheduler_requests() == 0


class FakeSoundDevice(types.ModuleType):
    """Just enough of ``sounddevice`` for SoundDeviceAudio: streams whose callbacks we call."""

    class PortAudioError(Exception):
        pass

    def __init__(self, mic_blocks):
        super().__init__("sounddevice")
        self.mic_blocks = list(mic_blocks)
        self.played = []
        fake = self

        class Stream:
            latency = 0.0

            def __init__(self, samplerate, channels, dtype, callback, blocksize=None, device=None):
                self.callback, self.rate = callback, samplerate

            def start(self):
                fake.streams.append(self)

            def stop(self):
                pass

            def close(self):
                pass

        self.InputStream = self.OutputStream = Stream
        self.streams = []

    def tick(self):
        """One 'hardware' period: deliver a mic block, pull 160 samples for the speaker."""
        mic, speaker = self.streams
        if self.mic_blocks:
            block = self.mic_blocks.pop(0)
            mic.callback(block[:, None], len(block), None, None)
        out = np.zeros((160, 1), np.float32)
        speaker.callback(out, 160, None, None)
        self.played.append(out[:, 0].copy())


def test_live_cli_on_a_fake_sound_card_then_ctrl_c(monkeypatch):
    """`speechctl chat` with no arguments: the sounddevice device layer drives the loop (mic
    callback -> VAD -> pipeline -> speaker callback); Ctrl-C ends it with a clean message."""
    mic = blocks(np.concatenate([silence(0.2), hello(), silence(1.0)]))
    fake = FakeSoundDevice([b.copy() for b in mic])
    monkeypatch.setitem(sys.modules, "sounddevice", fake)
    from speechctl.audio import devices

    real_read = devices.SoundDeviceAudio.read
    answered = []
    reads = []

    def read(self, wait):
        reads.append(1)
        assert len(reads) < 20000, "the turn was never answered"
        fake.tick()
        if not fake.mic_blocks and not self.playing() and answered:
            raise KeyboardInterrupt  # the user presses Ctrl-C once the reply has played
        return real_read(self, False)

    monkeypatch.setattr(devices.SoundDeviceAudio, "read", read)
    from speechctl.pipeline import chat

    real_finish = chat.ChatLoop._finish
    monkeypatch.setattr(chat.ChatLoop, "_finish", lambda self: answered.append(1) or real_finish(self))
    result = run("chat", *QUICK, "--silence-ms", "400")
    assert result.exit_code == 0, result.stderr
    assert "listening" in result.stderr and "you: " in result.stderr and "bye" in result.stderr
    assert "Traceback" not in result.stderr
    speaker = np.concatenate(fake.played)
    assert np.abs(speaker).max() > 0  # the reply came out of the (fake) speaker


def test_no_portaudio_is_a_one_line_error(monkeypatch):
    class NoPortAudio:  # what importing sounddevice does without libportaudio2
        def find_spec(self, name, path=None, target=None):
            if name == "sounddevice":
                raise OSError("PortAudio library not found")

    monkeypatch.delitem(sys.modules, "sounddevice", raising=False)
    monkeypatch.setattr(sys, "meta_path", [NoPortAudio(), *sys.meta_path])
    one_line_error(run("chat"), "PortAudio")
    one_line_error(run("tts", "hi", "--stream"), "PortAudio")
