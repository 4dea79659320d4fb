from __future__ import annotations

import click

from speechctl.cli.options import FIRST_LOOKAHEAD_HELP, engine_options, sampling_options, user_errors


@click.command("chat")
@click.option("--input", "input_path", metavar="WAV", help="Answer this recording: one turn, no microphone.")
@click.option("--output", "output_path", metavar="WAV", help="With --input: write the reply here instead of playing it.")
@click.option("--mode", type=click.Choice(["staged", "unified"]), default="staged", show_default=True, help="staged: ASR -> response LM -> TTS; unified: one speech LM (--model) hears and answers.")
@click.option("--lm-model", metavar="NAME|DIR", default=None, help="Response LM: tiny-lm (default, random weights) or a vLLM text model directory.")
@click.option("--asr-model", metavar="NAME|DIR", default=None, help="ASR: whisper-tiny.en (default) or a Whisper directory.")
@click.option("--max-reply-tokens", type=click.IntRange(1), default=96, show_default=True, help="Longest reply of the response LM.")
@click.option("--lm-temperature", type=click.FloatRange(0), default=0.7, show_default=True)
@click.option("--system", default=None, help="System prompt of the response LM.")
@click.option("--reply", "reply", type=click.Choice(["audio", "auto"]), default="audio", show_default=True, help="unified: open the reply with speech, or let the model choose text or speech.")
@click.option("--vad-threshold", type=float, default=-40.0, show_default=True, help="Speech level in dBFS; quieter sound is silence.")
@click.option("--silence-ms", type=click.IntRange(60), default=700, show_default=True, help="Silence that ends an utterance.")
@click.option("--min-speech-ms", type=click.IntRange(0), default=250, show_default=True, help="Shorter utterances (clicks, coughs) are skipped.")
@click.option("--no-barge-in", is_flag=True, help="Ignore speech while a reply plays (no headphones: the mic hears the reply).")
@click.option("--turns", type=click.IntRange(1), default=None, help="Live: stop after this many answered turns.")
@click.option("--max-seconds", type=click.FloatRange(0, min_open=True), default=10.0, show_default=True, help="Longest audio per phrase.")
@click.option("--first-chunk", type=click.IntRange(1, 64), default=2, show_default=True, help="Frames in the first audio chunk of each phrase.")
@click.option("--first-lookahead", type=click.IntRange(0, 64), default=None, help=FIRST_LOOKAHEAD_HELP)
@sampling_options
@engine_options
@user_errors
def command(input_path, output_path, mode, lm_model, asr_model, max_reply_tokens, lm_temperature, system, reply, vad_threshold, silence_ms, min_speech_ms, no_barge_in, turns, max_seconds, first_chunk, first_lookahead, sampling, engine):
    """Talk with a speech pipeline: microphone -> ASR -> response LM -> TTS -> speaker, live.

    Speak; a pause of --silence-ms ends your turn and the reply plays while it is still being
    generated. Speaking during a reply interrupts it. Ctrl-C quits. With --input, one recorded
    turn is answered (to --output, or the speaker) with no microphone.
    """
    from speechctl.errors import InputError
    from speechctl.pipeline.vad import VadConfig

    engine.one_engine("chat")
    if output_path and not input_path:
        raise InputError("--output needs --input (a live chat plays its replies)")
    if output_path:
        from speechctl.audio import check_writable, resolve_audio_format

        resolve_audio_format(output_path)  # a bad extension or place fails before any model loads
        check_writable(output_path)
    vad = VadConfig(threshold_db=vad_threshold, silence_ms=silence_ms, min_speech_ms=min_speech_ms)
    config = _chat_config(mode, lm_model, asr_model, max_reply_tokens, lm_temperature, system, reply, max_seconds,
                          dict(first_chunk=first_chunk, first_lookahead=first_lookahead), sampling)
    if input_path:
        _one_turn(input_path, output_path, config, vad, engine)
    else:
        _live(config, vad, not no_barge_in, turns, engine)


def _chat_config(mode, lm_model, asr_model, max_reply_tokens, lm_temperature, system, reply, max_seconds, chunking, sampling):
    from speechctl.pipeline.build import ChatConfig
    from speechctl.pipeline.lm import LmConfig

    lm = LmConfig(max_tokens=max_reply_tokens, temperature=lm_temperature)
    if system is not None:
        lm.system = system or None
    options = {**sampling.job_options(), "max_seconds": max_seconds}
    return ChatConfig(mode=mode, asr_model=asr_model, lm_model=lm_model, lm=lm, tts_options=options, reply_in_audio=reply == "audio", **chunking)


def _pipeline(config, engine):
    """Load the models (the speech model through the shared --model choice) and build the stages."""
    import torch

    from speechctl.pipeline.build import build_pipeline

    if torch.cuda.is_available() and config.mode == "staged":
        engine.config["gpu_memory_utilization"] = 0.4  # leave room for the ASR and LM engines
    return build_pipeline(engine.speech(), config)


def _one_turn(input_path, output_path, config, vad, engine):
    from speechctl.audio import read_audio
    from speechctl.errors import InputError
    from speechctl.pipeline.vad import contains_speech

    rate = 16000 if config.mode == "staged" else engine.sample_rate()
    audio = read_audio(input_path, rate)  # before any model loads
    if not contains_speech(audio, rate, vad):
        raise InputError(f"{input_path}: no speech (nothing above --vad-threshold {vad.threshold_db:g} dBFS for --min-speech-ms)")
    speaker = None
    if not output_path:  # no sound device: fail before the models load
        from speechctl.audio.wavstream import SpeakerSink

        speaker = SpeakerSink(engine.sample_rate())
    interrupted = False
    try:
        _answer(input_path, output_path, audio, rate, speaker, config, engine)
    except KeyboardInterrupt:  # Ctrl-C: stop at once, no traceback
        interrupted = True
        click.echo("\nstopped", err=True)
    finally:
        if speaker is not None:
            speaker.abort() if interrupted else speaker.close()  # close: let the reply finish


def _answer(input_path, output_path, audio, rate, speaker, config, engine):
    from speechctl.audio import write_audio
    from speechctl.errors import InputError
    from speechctl.pipeline.chat import run_one_turn

    pipeline = _pipeline(config, engine)
    turn = run_one_turn(pipeline, audio, rate, on_audio=speaker.write if speaker is not None else None)
    for error in turn.errors:
        click.echo(f"error: {error}", err=True)
    if turn.transcript is not None:
        click.echo(f"you: {turn.transcript}", err=True)
    if turn.skipped:
        raise InputError(f"{input_path}: no words recognized: nothing to answer")
    click.echo(f"reply: {turn.reply}", err=True)
    reply = turn.pipeline_turn.reply_audio
    rate_out = turn.sample_rate or engine.sample_rate()
    if output_path:
        write_audio(output_path, reply, rate_out)
    first = "" if turn.first_audio_s is None else f"; first audio {turn.first_audio_s:.2f} s after the end of the input"
    click.echo(f"{output_path or 'speaker'}: {turn.reply_seconds:.2f} s of audio at {rate_out} Hz{first}", err=True)


def _live(config, vad, barge_in, turns, engine):
    from speechctl.audio.devices import SoundDeviceAudio
    from speechctl.pipeline.chat import ChatLoop

    rate_in = 16000 if config.mode == "staged" else engine.sample_rate()
    device = SoundDeviceAudio(rate_in, engine.sample_rate())  # no device: fail before models load
    try:
        pipeline = _pipeline(config, engine)
        click.echo("listening (Ctrl-C to quit)", err=True)
        ChatLoop(pipeline, device, vad, barge_in=barge_in, on_event=_Transcript()).run(max_turns=turns)
    except KeyboardInterrupt:
        click.echo("\nbye", err=True)
    finally:
        device.close()


class _Transcript:
    """The live conversation on stderr: your words, the reply as it is generated, latencies."""

    def __init__(self):
        self.replying = False

    def __call__(self, kind, value):
        if kind == "transcript":
            click.echo(f"you: {value}", err=True)
        elif kind == "reply":
            if not self.replying:
                click.echo("reply: ", nl=False, err=True)
                self.replying = True
            click.echo(value, nl=False, err=True)
        elif kind in ("turn", "barge-in"):
            note = "[interrupted]" if kind == "barge-in" else ""
            if kind == "turn" and value.first_audio_s is not None:
                note = f"[first audio {value.first_audio_s:.2f} s]"
            click.echo(f" {note}" if self.replying else note, err=True)
            self.replying = False
        elif kind == "skipped":
            click.echo("(too short: skipped)", err=True)
        elif kind == "error":
            click.echo(f"error: {value}", err=True)
