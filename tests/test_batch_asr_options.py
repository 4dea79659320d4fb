"""How a batch's ASR items decode: Whisper's flags on the command line, an item's own fields over
them (speechctl.cli.asr.manifest_job_options). No engine: the options a job would carry."""

import click
import pytest
from click.testing import CliRunner

from speechctl.asr.options import PLAIN_GREEDY, WhisperOptions
from speechctl.cli.asr import manifest_job_options, whisper_options
from speechctl.cli.options import sampling_options
from speechctl.errors import InputError


def job_options(*flags: str, on_whisper: bool = True):
    """The batch command's ``job_options`` for these command-line flags."""
    seen = {}

    @click.command()
    @sampling_options
    @whisper_options
    def command(sampling, whisper, whisper_given):
        seen["options"] = manifest_job_options(sampling, whisper if on_whisper else None)

    result = CliRunner().invoke(command, list(flags), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return seen["options"]


def whisper_of(options, fields: dict) -> WhisperOptions:
    return options(fields, task="asr")["whisper"]


def test_an_item_without_fields_decodes_as_speechctl_asr_does_by_default():
    assert whisper_of(job_options(), {}) == WhisperOptions()


def test_the_command_line_sets_every_items_decoding():
    options = job_options("--beam-size", "1", "--without-timestamps", "--no-condition-on-previous-text",
                          "--temperature-increment-on-fallback", "none", "--no-speech-threshold", "none")
    assert whisper_of(options, {}) == PLAIN_GREEDY


def test_an_items_fields_win_over_the_command_line():
    options = job_options("--beam-size", "1", "--without-timestamps", "--temperature-increment-on-fallback", "none",
                          "--language", "en", "--temperature", "0.4")
    item = whisper_of(options, dict(beam_size=5, without_timestamps=False, temperature_increment_on_fallback=0.2,
                                    translate=True, language="de", temperature=0.0, word_timestamps=True,
                                    length_penalty=None, logprob_threshold=None, initial_prompt="Names: Ada."))
    assert item == WhisperOptions(beam_size=5, timestamps=True, temperatures=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
                                  task="translate", language="de", word_timestamps=True, logprob_threshold=None,
                                  initial_prompt="Names: Ada.")
    assert whisper_of(options, {}).temperatures == (0.4,)  # the command line's, where the item says nothing
    assert whisper_of(options, {"translate": False}).task == "transcribe"


def test_an_item_samples_text_with_its_own_temperature_and_seed():
    options = job_options("--best-of", "3")
    job = options(dict(temperature=0.5, top_k=20, seed=9, temperature_increment_on_fallback=None), task="asr")
    assert job["seed"] == 9
    assert job["whisper"] == WhisperOptions(best_of=3, temperatures=(0.5,), top_k=20)


def test_a_speech_lms_asr_item_refuses_whisper_fields_rather_than_ignore_them():
    options = job_options(on_whisper=False)
    assert "whisper" not in options({"temperature": 0.3}, task="asr")  # its own text sampling applies
    with pytest.raises(InputError, match="'beam_size': a Whisper decoding option; this batch's ASR items run on a speech LM"):
        options({"beam_size": 3}, task="asr")


def test_tts_items_are_untouched():
    options = job_options("--beam-size", "2")
    assert "whisper" not in options({"seed": 1})
