from __future__ import annotations

import sys

import click

from speechctl.cli.options import FIRST_LOOKAHEAD_HELP, engine_options, sampling_options, user_errors


@click.command("tts")
@click.argument("text")
@click.option("-o", "--output", metavar="FILE|-", help="Where to write the audio; - for stdout. With --stream and no -o: play it.")
@click.option("--stream", is_flag=True, help="Emit audio chunk by chunk while it is generated (to the speaker without -o).")
@click.option("--raw", is_flag=True, help="With --stream -o -: raw 16-bit PCM (s16le, mono), no wav header.")
@click.option("--first-chunk", type=click.IntRange(1, 64), default=2, show_default=True, help="With --stream: frames in the first chunk (later chunks double, up to 128 frames on a GPU, 32 on the CPU).")
@click.option("--first-lookahead", type=click.IntRange(0, 64), default=None, help="With --stream: f" + FIRST_LOOKAHEAD_HELP[1:])
@click.option("--voice", metavar="WAV", help="Reference audio of the voice to use.")
@click.option("--voice-text", metavar="TEXT", help="What the --voice recording says (Higgs Audio v2 prompts use it).")
@click.option("--codes-out", metavar="FILE.npy", help="Also write the generated codes [K, T] (numpy .npy), to compare with a reference.")
@click.option("--repetition-window", type=click.IntRange(0, 32), default=None, help="Repetition-aware sampling: window in steps (0 = off; default: the checkpoint's, e.g. Higgs' 7).")
@click.option("--repetition-max", type=click.IntRange(1), default=None, help="Repetition-aware sampling: repeats within the window that force a redraw (default: the checkpoint's).")
@click.option("--format", "fmt", type=click.Choice(["wav", "flac"]), default=None, help="Audio format (default: from the file name, else wav).")
@click.option("--max-seconds", "--seconds", "max_seconds", type=click.FloatRange(0, min_open=True), default=None,
              help="Length of the audio: the most speech may take (it ends sooner where the model ends it), exactly "
                   "this much music (MusicGen). Default: the checkpoint's length, else 20 s.")
@sampling_options
@engine_options
@user_errors
def command(text, output, voice, voice_text, codes_out, repetition_window, repetition_max, fmt, max_seconds, stream, raw,
            first_chunk, first_lookahead, sampling, engine):
    """Speak TEXT (or - to read it from stdin) and write the audio to FILE, or stream it."""
    from speechctl.audio import check_writable, read_audio, resolve_audio_format, write_audio
    from speechctl.errors import InputError

    engine.one_engine("tts")
    if output is None and not stream:
        raise InputError("no output: give -o FILE (- for stdout), or --stream to play on the speaker")
    if raw and not (stream and output == "-"):
        raise InputError("--raw is for streaming to stdout: --stream -o - --raw")
    if text == "-":
        text = sys.stdin.read()
    if not text.strip():
        raise InputError("empty text: nothing to speak")
    if voice_text is not None and voice is None:
        raise InputError("--voice-text needs --voice (the recording it transcribes)")
    extras = {} if voice_text is None else {"voice_text": voice_text}
    if repetition_window is not None or repetition_max is not None:
        extras["repetition"] = _repetition(repetition_window, repetition_max)
    if output is not None:
        check_writable(output)  # before the model loads
    if first_lookahead is not None and not stream:
        raise InputError("--first-lookahead is for streaming (--stream)")
    if codes_out is not None:
        if stream:
            raise InputError("--codes-out is for one-shot synthesis (without --stream)")
        check_writable(codes_out)
    if stream:
        chunking = dict(first_chunk=first_chunk, first_lookahead=first_lookahead)
        return _stream(text, output, voice, extras, fmt, max_seconds, raw, chunking, sampling, engine)
    fmt = resolve_audio_format(output, fmt)
    voice_wav = read_audio(voice, engine.sample_rate()) if voice else None  # before the model loads
    speech = engine.speech()
    options = sampling.job_options(defaults=speech.checkpoint.defaults)
    result = speech.tts(text, voice=voice_wav, max_seconds=max_seconds, **extras, **options)
    write_audio(output, result.audio, result.sample_rate, fmt)
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    if codes_out is not None:
        from speechctl.audio import write_npy_atomic

        write_npy_atomic(codes_out, result.codes)
    if output != "-":
        click.echo(f"{output}: {result.duration:.2f} s of audio at {result.sample_rate} Hz", err=True)


def _stream(text, output, voice, extras, fmt, max_seconds, raw, chunking, sampling, engine):
    """Chunks go out as the codec decodes them (speechctl.api.Speech.stream_tts)."""
    import time

    from speechctl.audio import read_audio, resolve_audio_format
    from speechctl.audio.wavstream import open_sink
    from speechctl.errors import EngineError

    fmt = "wav" if output is None or (output == "-" and raw) else resolve_audio_format(output, fmt)
    rate = engine.sample_rate()
    voice_wav = read_audio(voice, rate) if voice else None  # before the model loads
    sink = open_sink(output, rate, fmt, raw)  # no speaker / bad path: fail before the model loads
    interrupted = False
    try:
        speech = engine.speech()
        started = time.perf_counter()
        options = dict(voice=voice_wav, max_seconds=max_seconds, **extras,
                       **sampling.job_options(defaults=speech.checkpoint.defaults))
        for chunk in speech.stream_tts(text, **chunking, **options):
            if chunk.error:
                raise EngineError(chunk.error)
            sink.write(chunk.audio)
    except KeyboardInterrupt:  # Ctrl-C: stop playing at once, no traceback
        interrupted = True
    finally:
        getattr(sink, "abort", sink.close)() if interrupted else sink.close()
    if interrupted:
        click.echo("stopped", err=True)
    elif output != "-":
        first = "" if sink.first_audio is None else f"; first audio after {sink.first_audio - started:.2f} s"
        where = output or "speaker"
        click.echo(f"{where}: {sink.samples / rate:.2f} s of audio at {rate} Hz{first}", err=True)


def _repetition(window, max_repeat) -> tuple[int, int]:
    """(window, max_repeat) from the two flags (both, or a window of 0: off)."""
    from speechctl.errors import InputError

    if window == 0:
        return (0, 0)
    if window is None or max_repeat is None:
        raise InputError("--repetition-window and --repetition-max go together (--repetition-window 0 turns it off)")
    return (window, max_repeat)
