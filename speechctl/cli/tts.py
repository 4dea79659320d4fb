from __future__ import annotations

import sys

import click

from speechctl.cli.options import engine_options, sampling_options, user_errors


@click.command("tts")
@click.argument("text")
@click.option("-o", "--output", required=True, metavar="FILE|-", help="Where to write the audio; - for stdout.")
@click.option("--voice", metavar="WAV", help="Reference audio of the voice to use.")
@click.option("--format", "fmt", type=click.Choice(["wav", "flac"]), default=None, help="Audio format (default: from the file name, else wav).")
@click.option("--max-seconds", type=click.FloatRange(0, min_open=True), default=20.0, show_default=True, help="Longest audio to generate.")
@sampling_options
@engine_options
@user_errors
def command(text, output, voice, fmt, max_seconds, sampling, engine):
    """Speak TEXT (or - to read it from stdin) and write the audio to FILE."""
    from speechctl.audio import read_audio, resolve_audio_format, write_audio
    from speechctl.errors import InputError

    if text == "-":
        text = sys.stdin.read()
    if not text.strip():
        raise InputError("empty text: nothing to speak")
    fmt = resolve_audio_format(output, fmt)
    voice_wav = read_audio(voice, engine.sample_rate()) if voice else None  # before the model loads
    speech = engine.speech()
    result = speech.tts(text, voice=voice_wav, max_seconds=max_seconds, **sampling.job_options())
    write_audio(output, result.audio, result.sample_rate, fmt)
    if output != "-":
        click.echo(f"{output}: {result.duration:.2f} s of audio at {result.sample_rate} Hz", err=True)
