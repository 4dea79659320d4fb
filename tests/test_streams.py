import numpy as np
import pytest

from speechctl.engine.streams import DelayPattern, StreamSpec, complete_frames

LAYOUTS = {
    "musicgen": (0, 1, 2, 3),
    "parallel": (0, 0, 0),
    "dia": (0, 8, 9, 10, 11, 12, 13, 14, 15),
    "opuslm": (1, 2, 3, 4),
    "single": (0,),
}


@pytest.mark.parametrize("frames", [0, 1, 2, 17])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_build_revert_round_trip(name, frames):
    pattern = DelayPattern(LAYOUTS[name], codebook_size=32)
    codes = np.random.default_rng(frames).integers(0, 32, (pattern.num_streams, frames))
    steps = pattern.build(codes)
    assert steps.shape == (pattern.num_streams, frames + pattern.max_delay + 1)
    np.testing.assert_array_equal(pattern.revert(steps), codes)
    assert pattern.code_mask(frames).sum() == codes.size


def test_layout_matches_drawing():
    p = DelayPattern((0, 1, 2), codebook_size=10)
    B, E, P = p.bos, p.eos, p.pad
    steps = p.build(np.array([[1, 2], [3, 4], [5, 6]]))
    np.testing.assert_array_equal(
        steps, [[1, 2, E, P, P], [B, 3, 4, E, P], [B, B, 5, 6, E]]
    )


@pytest.mark.parametrize("frames", [0, 1, 5, 17])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_decoder_prompt_round_trip(name, frames):
    """An encoder-decoder prompt (start frame, audio, the delayed streams' forced first steps)
    read back as generated steps gives the codes again."""
    pattern = DelayPattern(LAYOUTS[name], codebook_size=32)
    codes = np.random.default_rng(frames).integers(0, 32, (pattern.num_streams, frames))
    prompt, forced = pattern.decoder_prompt(codes)
    assert prompt.shape == (frames + 1, pattern.num_streams)
    assert (prompt[0] == pattern.bos).all()
    if not frames:
        assert forced is None
        return
    assert forced.shape == (pattern.max_delay, pattern.num_streams)
    steps = np.concatenate([prompt[1:], forced])  # what a stream holds after the start frame
    np.testing.assert_array_equal(complete_frames(steps, pattern.delays), codes)
    for k, d in enumerate(pattern.delays):
        assert (prompt[1 : 1 + min(d, frames), k] == pattern.bos).all()
        np.testing.assert_array_equal(forced[:, k] == -1, np.arange(pattern.max_delay) >= d)  # free from its delay on


def test_decoder_prompt_matches_drawing():
    p = DelayPattern((0, 1), codebook_size=10)
    B = p.bos
    prompt, forced = p.decoder_prompt(np.array([[1, 2], [3, 4]]))
    np.testing.assert_array_equal(prompt, [[B, B], [1, B], [2, 3]])
    np.testing.assert_array_equal(forced, [[-1, 4]])
    with pytest.raises(ValueError):
        p.decoder_prompt(np.zeros((3, 2), dtype=int))


@pytest.mark.parametrize("frames", [1, 5, 17])
@pytest.mark.parametrize("name", [n for n, d in LAYOUTS.items() if min(d) == 0])
def test_continued_audio_round_trip(name, frames):
    """Continued speech (a voice prompt the new speech follows on from): its open steps and the
    generated steps' forced lead-in hold every frame of it once, where the whole layout has it."""
    pattern = DelayPattern(LAYOUTS[name], codebook_size=32)
    codes = np.random.default_rng(frames).integers(0, 32, (pattern.num_streams, frames))
    steps, lead_in = pattern.continuation(codes)
    np.testing.assert_array_equal(steps, pattern.build(codes)[:, :frames])
    assert lead_in.shape == (max(1, pattern.max_delay), pattern.num_streams)
    given = np.concatenate([steps.T, np.where(lead_in >= 0, lead_in, pattern.bos)])  # [steps, K]
    for k, d in enumerate(pattern.delays):
        np.testing.assert_array_equal(given[d : d + frames, k], codes[k])  # frame t at step t + d
        assert (lead_in[d:, k] == -1).all()  # free from its delay on: the new speech's frames


def test_continued_audio_matches_drawing():
    p = DelayPattern((0, 1, 2), codebook_size=10)
    B = p.bos
    steps, lead_in = p.continuation(np.array([[1, 2], [3, 4], [5, 6]]))
    np.testing.assert_array_equal(steps, [[1, 2], [B, 3], [B, B]])
    np.testing.assert_array_equal(lead_in, [[-1, 4, 5], [-1, -1, 6]])
    with pytest.raises(ValueError, match="no delay"):
        DelayPattern((1, 2), codebook_size=10).continuation(np.zeros((2, 3), dtype=int))


def test_revert_rejects_malformed_layouts():
    p = DelayPattern((0, 1), codebook_size=10)
    steps = p.build(np.array([[1, 2], [3, 4]]))
    bad = steps.copy()
    bad[1, 0] = 5  # a code where BOS belongs
    with pytest.raises(ValueError, match="malformed"):
        p.revert(bad)
    bad = steps.copy()
    bad[0, 1] = p.pad  # a special where a code belongs
    with pytest.raises(ValueError, match="malformed"):
        p.revert(bad)
    with pytest.raises(ValueError):
        p.revert(steps[:, :1])


def test_build_rejects_out_of_range_codes():
    p = DelayPattern((0, 1), codebook_size=10)
    with pytest.raises(ValueError):
        p.build(np.array([[1, 10], [0, 0]]))
    with pytest.raises(ValueError):
        p.build(np.zeros((3, 2), dtype=int))


def test_spec_round_trips_through_config_dict():
    from speechctl.models.generic.checkpoint import byte_stream_spec

    spec = byte_stream_spec((0, 1, 2, 3), 64)
    assert StreamSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="invalid speechctl stream config"):
        StreamSpec.from_dict({"delays": [0]})


def test_tts_options_reach_the_family_and_a_stray_keyword_is_named():
    """``PromptBuilder.tts`` takes TtsOptions' fields (min_frames defaulting to the family's),
    hands a family its own keywords, and refuses any other keyword by name."""
    from transformers import AutoTokenizer

    from speechctl.models.families import open_checkpoint
    from speechctl.models.tiny import ensure_tiny

    path = ensure_tiny()
    prompts = open_checkpoint(path).prompt_builder(AutoTokenizer.from_pretrained(str(path)))
    req = prompts.tts("hi", max_frames=7, seed=3, tag="t")
    assert (req.max_frames, req.seed, req.tag, req.min_frames) == (7, 3, "t", prompts.min_frames)
    assert prompts.tts("hi", min_frames=5).min_frames == 5
    with pytest.raises(TypeError, match="speaker"):
        prompts.tts("hi", speaker=1)  # CSM's keyword: not this family's


def test_summed_embeddings_bound_the_rows_a_lookup_holds(monkeypatch):
    """A prefill's [n, K] codebook ids are summed a bounded number of rows at a time (the lookup
    makes [rows, K, H] first: 768 MiB at once for Higgs 3B's 16,384-token prefill), the same
    numbers as the one-shot sum, in bfloat16 too, ragged last chunk included."""
    import torch
    from torch import nn

    from speechctl.models import stream_model

    table = nn.Embedding(4 * 32, 16).to(torch.bfloat16)
    ids = torch.randint(0, 4 * 32, (23, 4), generator=torch.Generator().manual_seed(0))
    seen = []
    lookup = table.forward
    monkeypatch.setattr(table, "forward", lambda x: seen.append(x.shape[0]) or lookup(x))
    monkeypatch.setattr(stream_model, "SUMMED_ROWS", 10)
    assert torch.equal(stream_model.summed_embeddings(table, ids), lookup(ids).sum(dim=1))
    assert seen == [10, 10, 3]
    seen.clear()
    assert torch.equal(stream_model.summed_embeddings(table, ids[:10]), lookup(ids[:10]).sum(dim=1)) and seen == [10]
