"""The speechctl command line: a root group whose commands load lazily (``--help`` imports no
torch or vLLM)."""

from __future__ import annotations

import importlib

import click

COMMANDS = {
    "tts": ("speechctl.cli.tts", "Speak text: write a wav/flac file (or stdout)."),
    "asr": ("speechctl.cli.asr", "Transcribe audio files."),
    "batch": ("speechctl.cli.batch", "Run a JSONL manifest of TTS/ASR items with continuous batching."),
    "models": ("speechctl.cli.models", "List models, or describe one."),
    "chat": ("speechctl.cli.chat", "Talk with a speech pipeline (mic -> ASR -> LM -> TTS -> speaker), or answer a recording."),
    "bench": ("speechctl.cli.bench", "Benchmarks: CFG throughput (--cfg), streaming latency (--stream)."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        return importlib.import_module(COMMANDS[name][0]).command

    def format_commands(self, ctx, formatter):
        rows = [(name, help_text) for name, (_, help_text) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="speechctl")
def cli():
    """Speech language models on vLLM: text to speech, speech to text, batches."""


def main():
    cli(prog_name="speechctl")
