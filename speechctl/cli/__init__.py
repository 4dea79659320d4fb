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
    """The console script: the command, then the process ends at once (``leave``)."""
    try:
        cli.main(prog_name="speechctl")
    except SystemExit as e:
        leave(e.code)
    leave(0)


def leave(code) -> None:
    """End the process with ``code`` (SystemExit's: None, a number, or a message for stderr).

    Once a command has returned, its outputs are written (atomically) and only stdout and stderr
    may hold unwritten bytes. What Python's own exit would do after that, in a process that ran
    vLLM, is tear down: vLLM's engine shutdown collects the garbage twice and the modules of torch
    and vLLM finalize, ~2.5 s of a 10 s cold ``speechctl tts`` or ``asr`` on a 2-core CPU, and
    nothing that the end of the process does not do anyway. So the streams are flushed and the
    process exits without it (``os._exit``). Not when the command started child processes (data-
    or tensor-parallel workers: their shutdown stops them) or never loaded vLLM."""
    import multiprocessing
    import os
    import sys

    if "vllm" not in sys.modules or multiprocessing.active_children():
        sys.exit(code)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): the message goes to stderr, status 1
        print(code, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (``| head``) or stream: nothing more reaches it
            pass
    os._exit(status)
