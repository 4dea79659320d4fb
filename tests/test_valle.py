"""The AR+NAR family (VALL-E style) through speechctl equals an independent plain-PyTorch
reference of both stages (``valle_reference.py``), token for token on all codebooks: greedy, a
batch of requests of different lengths with voice prompts, under forced preemption and chunked
prefill (one shared engine); the NAR stage's batches equal one utterance at a time; sampling of
both stages is seeded and batch-independent; CFG rides on the AR stage; the API, streaming and
the CLI give audio as for any family."""

from __future__ import annotations

import numpy as np
import pytest
from follow_tokens import TIE_GAP

pytestmark = pytest.mark.engine

# 4 usable KV blocks of 32 positions for requests of 20-110 (preemption, checked below); prefill
# chunks of 64 positions (the longest prompts are split); CFG prompts up to 32 positions fit
ENGINE = dict(max_model_len=128, max_num_seqs=8, dtype="float32", block_size=32, kv_cache_bytes=1 << 27,
              num_kv_blocks=5, max_num_batched_tokens=64, enable_chunked_prefill=True)


@pytest.fixture(scope="module")
def valle_path(tmp_path_factory):
    from speechctl.models.valle.checkpoint import ValleRecipe, create_valle_checkpoint

    return create_valle_checkpoint(tmp_path_factory.mktemp("valle") / "tiny-valle", ValleRecipe(seed=3, init_std=0.3))


@pytest.fixture(scope="module")
def reference(valle_path):
    from valle_reference import ValleReference

    return ValleReference(valle_path)


@pytest.fixture(scope="module")
def speech(valle_path, engines_of_this_module):
    from speechctl.api import Speech
    from speechctl.engine.config import EngineConfig

    s = Speech(valle_path, engine_config=EngineConfig(**ENGINE))
    yield s
    s.close()


def voice(rng, frames, K=4, C=64):
    return rng.integers(0, C, (K, frames))


def parity_cases(prompts, rng):
    """(request, text, voice_text): 10 TTS requests, prompts of 6-90 positions, 4 with voices."""
    texts = ["Hi", "Hello world", "A longer sentence to speak aloud.", "x" * 40, "Ünïcödé ✓", "y" * 80]
    cases = [(prompts.tts(t, max_frames=4 + 5 * i, tag=f"tts{i}"), t, None) for i, t in enumerate(texts)]
    cases.append((prompts.tts("at least twelve", min_frames=12, max_frames=20, tag="min"), "at least twelve", None))
    for i, (frames, transcript) in enumerate([(5, None), (13, "the voice says this"), (9, None)]):
        text = f"with voice {i}"
        req = prompts.tts(text, voice_codes=voice(rng, frames), voice_text=transcript, max_frames=10 + 4 * i, tag=f"voice{i}")
        cases.append((req, text, transcript))
    return cases


def codes_of(speech, out) -> np.ndarray:
    (codes,) = speech.prompts.audio_segments(out, starts_in_audio=True)
    return codes


def assert_equal_codes(reference, speech, case, out, tolerant: bool | None = None):
    """The output's codes [K, T] are the reference's. On CUDA (``tolerant``), vLLM's float32
    kernels round otherwise, so the reference follows our tokens, as test_parity's tolerant check:
    rule tokens exactly, and each free choice of either stage its argmax or within TIE_GAP of it."""
    import torch

    req, text, transcript = case
    assert out.error is None, f"{req.tag}: {out.error}"
    codes = codes_of(speech, out)
    if not (torch.cuda.is_available() if tolerant is None else tolerant):
        np.testing.assert_array_equal(codes, reference.generate(req, text, transcript), err_msg=f"{req.tag}: codes differ")
        return
    reference.ar.generate(reference.ar_request(req), forced=(out.token_ids, out.aux[:, :1]))
    gaps = [gap for _, _, gap in reference.ar.disagreements]
    voice_codes = req.audio_items[0] if req.audio_items else np.zeros((codes.shape[0], 0), np.int64)
    for j in range(1, codes.shape[0]):
        logits = reference.nar_logits(reference.text_ids(text, transcript), voice_codes, list(codes[:j]), j)
        ours = logits.gather(1, torch.as_tensor(codes[j], dtype=torch.int64)[:, None])[:, 0]
        gaps += [float(g) for g in logits.max(dim=-1).values - ours if g > 0]
    assert all(g < TIE_GAP for g in gaps), f"{req.tag}: not a near tie: {max(gaps)}"


def test_greedy_equals_reference_under_preemption(speech, reference):
    cases = parity_cases(speech.prompts, np.random.default_rng(0))
    assert len(cases) >= 8
    outs = {o.tag: o for o in speech.engine.generate([c[0] for c in cases])}
    assert len(outs) == len(cases)
    lengths = set()
    for case in cases:
        out = outs[case[0].tag]
        assert_equal_codes(reference, speech, case, out)
        assert_equal_codes(reference, speech, case, out, tolerant=True)  # CUDA's check, exercised here too
        codes = codes_of(speech, out)
        assert codes.shape[0] == 4
        lengths.add(codes.shape[1])
    assert len(lengths) >= 5, "requests should end at different lengths"
    stats = speech.engine.stats()
    assert stats["resumed"] > 0, "the tiny KV cache should have forced preemption"
    assert stats["nar_utterances"] >= len(cases)


def test_nar_batches_equal_one_utterance_at_a_time(speech):
    """The NAR stage batched (padded, several batches by the token budget) equals each utterance
    alone, greedy and sampled with seeds."""
    from speechctl.engine.params import GREEDY, Sampling
    from speechctl.models.valle.nar_stage import NarJob, NarStage
    from speechctl.models.valle.prompts import NarInputs

    rng = np.random.default_rng(1)
    sampled = Sampling(temperature=1.0, top_k=20, top_p=0.9)
    jobs = [NarJob(i, NarInputs(rng.integers(0, 256, 2 + 7 * i), voice(rng, 3 * (i % 3)), GREEDY if i % 2 else sampled),
                   rng.integers(0, 64, 4 + 5 * i), seed=100 + i) for i in range(9)]
    stage = NarStage(speech.engine.nar.model, speech.engine.nar.device, max_batch_tokens=200, threaded=False)
    batched = stage.run(jobs)
    assert stage.stats["batches"] > 1 and stage.stats["largest_batch"] > 2
    for job, codes in zip(jobs, batched):
        np.testing.assert_array_equal(codes, stage.run([job])[0], err_msg=f"utterance {job.key}")
        np.testing.assert_array_equal(codes[0], job.first)
    greedy = stage.run([NarJob(0, jobs[0].inputs._replace(sampling=GREEDY), jobs[0].first, 100)])[0]
    assert not np.array_equal(greedy, batched[0]), "sampling should differ from greedy"


def test_the_nar_stage_never_blocks_the_ar_step_loop(speech):
    """A NAR batch held up (its worker waits on an event) does not hold up vLLM: the long
    request's AR stage runs to its end meanwhile, every step returns without waiting, and the
    results come once the batch is let go."""
    import threading
    import time

    engine = speech.engine
    stage = engine.nar
    gate, entered = threading.Event(), threading.Event()
    run_batch = stage._run_batch

    def held(jobs):
        entered.set()
        assert gate.wait(60), "the test never let the NAR batch go"
        return run_batch(jobs)

    stage._run_batch = held
    counted = engine.stats()
    try:
        short, long = (speech.prompts.tts(f"text {n}", max_frames=n, min_frames=n, tag=f"len{n}") for n in (3, 24))
        engine.submit(short)
        engine.submit(long)
        slowest, outputs = 0.0, []
        while engine.ar.has_work():
            started = time.perf_counter()
            outputs += engine.step()
            slowest = max(slowest, time.perf_counter() - started)
        assert entered.is_set() and not gate.is_set(), "the short request's NAR batch should be held up now"
        assert outputs == [] and engine.has_work()
        now = engine.stats()
        assert now["ar_steps_beside_nar"] - counted["ar_steps_beside_nar"] > 15
        assert now["handoff_s"] - counted["handoff_s"] < 1.0
        assert slowest < 5.0, f"a step took {slowest:.1f} s while the NAR stage was held"
    finally:
        gate.set()
        stage._run_batch = run_batch
    while engine.has_work():
        outputs += engine.step()
    assert sorted(o.tag for o in outputs) == ["len24", "len3"]
    assert all(o.error is None and codes_of(speech, o).shape == (4, int(o.tag[3:])) for o in outputs)


def test_nar_with_the_ar_backbones_layers_equals_reference(tmp_path):
    """``shared_layers``: the NAR runs the AR backbone's weights with its own AdaLN and heads."""
    import torch

    from valle_reference import ValleReference

    from speechctl.engine.params import GREEDY
    from speechctl.models.families import open_checkpoint
    from speechctl.models.valle.checkpoint import ValleRecipe, create_valle_checkpoint
    from speechctl.models.valle.nar import load_nar
    from speechctl.models.valle.nar_stage import NarJob, NarStage
    from speechctl.models.valle.prompts import NarInputs

    path = create_valle_checkpoint(tmp_path / "shared", ValleRecipe(seed=4, init_std=0.3, shared_layers=True))
    ck = open_checkpoint(path)
    stage = NarStage(load_nar(path, ck.config, [path / "model.safetensors"], device="cpu", dtype=torch.float32), "cpu", threaded=False)
    reference, rng = ValleReference(path), np.random.default_rng(2)
    jobs = [NarJob(i, NarInputs(rng.integers(0, 256, 5 + i), voice(rng, 2 * i), GREEDY), rng.integers(0, 64, 6 + 3 * i), 0)
            for i in range(3)]
    for job, codes in zip(jobs, stage.run(jobs)):
        np.testing.assert_array_equal(codes, reference.nar(job.inputs.text_ids, job.inputs.prompt_codes, job.first))


def test_seeded_sampling_of_both_stages_does_not_depend_on_the_batch(speech):
    from speechctl.engine.params import Sampling

    prompts = speech.prompts
    ar, nar = Sampling(temperature=1.0, top_k=20, top_p=0.9), Sampling(temperature=0.8, top_k=10)

    def target(seed=11, depth=nar):
        return prompts.tts("Sample me.", audio_sampling=ar, depth_sampling=depth, seed=seed, max_frames=20, tag="target")

    codes = lambda out: codes_of(speech, out)  # noqa: E731
    (alone,) = speech.engine.generate([target()])
    others = [prompts.tts(f"Other {i}", audio_sampling=Sampling(temperature=0.5 + i), depth_sampling=nar, seed=i,
                          max_frames=8 + i, tag=i) for i in range(4)]
    together = {o.tag: o for o in speech.engine.generate(others[:2] + [target()] + others[2:])}
    np.testing.assert_array_equal(codes(together["target"]), codes(alone))
    (greedy_nar,) = speech.engine.generate([target(depth=None)])
    assert np.array_equal(codes(greedy_nar)[0], codes(alone)[0]), "codebook 1 is the AR stage's alone"
    assert not np.array_equal(codes(greedy_nar)[1:], codes(alone)[1:]), "NAR sampling should differ from greedy"


def test_cfg_on_the_ar_stage_equals_reference(speech, reference):
    from speechctl.engine.params import Guidance

    prompts, rng = speech.prompts, np.random.default_rng(3)
    cases = [(prompts.tts(t, guidance=Guidance(scale=s, streams="audio"), max_frames=12, tag=t), t, None)
             for t, s in [("Guided", 2.0), ("More guided.", 3.0)]]
    cases.append((prompts.tts("voiced", voice_codes=voice(rng, 4), guidance=Guidance(scale=1.5), max_frames=10, tag="v"),
                  "voiced", None))
    cases.append((prompts.tts("Unguided", max_frames=12, tag="plain"), "Unguided", None))
    outs = {o.tag: o for o in speech.engine.generate([c[0] for c in cases])}
    for case in cases:
        assert_equal_codes(reference, speech, case, outs[case[0].tag])
    assert speech.engine.stats()["pair_violations"] == 0


def test_speech_api_and_streaming_give_the_codecs_audio(speech, reference):
    """``Speech.tts`` / ``run`` (a voice given as a waveform, with its transcript) / ``stream_tts``:
    codes as the reference's, audio = the codec's decode of them, streamed chunks = the one-shot
    audio (the whole utterance after the NAR stage)."""
    from speechctl.api import GREEDY, TtsJob

    rng = np.random.default_rng(4)
    wave = (0.1 * rng.standard_normal(7 * speech.codec.hop_length)).astype(np.float32)
    jobs = [TtsJob(id="plain", text="Hello world", max_seconds=0.3, audio_sampling=GREEDY),
            TtsJob(id="voice", text="Hello there", voice=wave, voice_text="a transcript", max_seconds=0.3, audio_sampling=GREEDY)]
    results = {r.id: r for r in speech.run(jobs)}
    (voice_codes,) = speech.codec.encode([wave])
    for job in jobs:
        r = results[job.id]
        assert r.error is None, r.error
        codes = voice_codes if job.voice is not None else None
        req = speech.prompts.tts(job.text, voice_codes=codes, voice_text=job.voice_text, max_frames=speech.max_frames(0.3))
        (out,) = speech.engine.generate([req])
        assert_equal_codes(reference, speech, (req, job.text, job.voice_text), out)
        np.testing.assert_array_equal(r.codes, codes_of(speech, out))  # what the API returned
        np.testing.assert_allclose(r.audio, speech.codec.decode([r.codes])[0], atol=1e-5)
    one = speech.tts("Hello world", max_seconds=0.3, audio_sampling=GREEDY)
    np.testing.assert_array_equal(one.codes, results["plain"].codes)
    chunks = list(speech.stream_tts("Hello world", max_seconds=0.3, audio_sampling=GREEDY))
    assert chunks[-1].last and not chunks[-1].error
    streamed = np.concatenate([c.audio for c in chunks])
    peak = np.abs(one.audio).max()
    np.testing.assert_allclose(streamed, one.audio, atol=1e-5 * max(peak, 1.0))


def test_bad_inputs_are_one_line_errors(speech, valle_path, tmp_path):
    import shutil

    from speechctl.errors import InputError, ModelError
    from speechctl.models.families import open_checkpoint
    from speechctl.models.valle.nar import load_nar

    prompts = speech.prompts
    for call, fragment in [
        (lambda: prompts.tts("x", voice_codes=np.zeros((2, 5), np.int64)), "voice codes: expected [4, T>0]"),
        (lambda: prompts.tts("x", voice_codes=np.full((4, 5), 64)), "voice codes: codes must lie in [0, 64)"),
        (lambda: prompts.tts("x", voice_text="no voice"), "voice_text: a transcript needs its voice"),
        (lambda: prompts.tts("x", repetition=(7, 2)), "no repetition-aware sampling"),
        (lambda: prompts.asr(np.zeros((4, 3), np.int64)), "does not transcribe"),
    ]:
        with pytest.raises(InputError) as e:
            call()
        assert fragment in str(e.value) and "\n" not in str(e.value)
    broken = tmp_path / "no-nar"
    shutil.copytree(valle_path, broken)
    shutil.rmtree(broken / "nar")
    ck = open_checkpoint(broken)
    with pytest.raises(ModelError, match="nar/model.safetensors: missing"):
        load_nar(broken, ck.config, [], device="cpu", dtype=None)


def test_cli_describes_the_stages_and_speaks(valle_path, tmp_path, speech):
    import soundfile as sf
    from click.testing import CliRunner

    from speechctl.cli import cli

    runner = CliRunner()
    described = runner.invoke(cli, ["models", str(valle_path)], catch_exceptions=False)
    assert described.exit_code == 0
    assert "stage 1 (AR)" in described.stdout and "stage 2 (NAR)" in described.stdout and "SpeechctlValleLM" in described.stdout
    listed = runner.invoke(cli, ["models"], catch_exceptions=False).stdout
    assert "SpeechctlValleLM" in listed
    out = tmp_path / "hello.wav"
    result = runner.invoke(cli, ["tts", "Hello world", "--model", str(valle_path), "--max-seconds", "0.3", "-o", str(out),
                                 "--temperature", "0", "--max-model-len", "128", "--max-num-seqs", "8"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    audio, rate = sf.read(out, dtype="float32")
    from speechctl.api import GREEDY

    expected = speech.tts("Hello world", max_seconds=0.3, audio_sampling=GREEDY)  # the same codes, so the same audio
    assert rate == speech.sample_rate
    np.testing.assert_allclose(audio, expected.audio, atol=1e-4)
