import numpy as np
import pytest

from speechctl.engine.streams import DelayPattern, StreamSpec

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
