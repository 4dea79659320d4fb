"""Repetition-aware sampling (Higgs' RAS) in the runtime's sampling step, checked against its rule
as transformers' ``generate`` applies it: a codebook's token that already appears ``max_repeat``
times among the codebook's last ``window`` steps (prompt audio included, BOS/EOS never counted) is
replaced by a draw from the raw, unfiltered distribution — in greedy decoding too."""

import numpy as np
import torch

from speechctl.engine.params import GREEDY, StreamParams
from speechctl.engine.streams import DelayPattern, StreamSpec
from speechctl.engine.runtime import StreamRuntime
from speechctl.engine.runtime.runtime import ScheduledRows
from speechctl.engine.runtime.slots import Admitted
from speechctl.models.higgs.checkpoint import HiggsRecipe, higgs_config
from speechctl.models.higgs.family import higgs_audio_v2_spec

SPEC = higgs_audio_v2_spec(higgs_config(HiggsRecipe()).to_dict())  # K=4, 32 codes, BOS 32, EOS 33
K, C = SPEC.num_codebooks, SPEC.pattern.codebook_size
BOS, EOS = SPEC.pattern.bos, SPEC.pattern.eos
PROMPT = 5


def step_once(rows: int, history_steps, raw: torch.Tensor, past: np.ndarray, repetition=(3, 2), seed0=0, spec=SPEC):
    """One sampling step at generated index len(past) for ``rows`` identical requests (their own
    seeds): ``past`` [g, K] recorded tokens, ``history_steps`` the prompt audio's last steps,
    ``raw`` [Va] the logits every codebook gets. Returns the [rows, K] tokens."""
    runtime = StreamRuntime(spec, max_rows=rows, max_len=64, device=torch.device("cpu"))
    g = len(past)
    added = [Admitted(i, StreamParams(f"r{i}", seed0 + i, audio=GREEDY, starts_in_audio=True, min_frames=0,
                                      repetition=repetition, history=tuple(map(tuple, history_steps))), PROMPT)
             for i in range(rows)]
    runtime.admit(rows, [], added, [])
    slots = runtime.table.row_slots[:rows]
    if g:
        runtime.table.gen_aux[slots, :g] = torch.as_tensor(past, dtype=torch.int32)
    runtime.table.n_gen[slots] = g
    runtime.rows = ScheduledRows(rows, slots, torch.full((rows,), PROMPT + g - 1))
    runtime.sample(torch.zeros(rows, 300), raw.expand(rows, spec.num_codebooks, -1).clone())
    return runtime.table.gen_aux[slots, g].numpy()


def logits_favouring(token: int, p: float, spec=SPEC) -> torch.Tensor:
    """Raw logits over the stream vocabulary: ``token`` with probability ``p``, the rest uniform."""
    probs = torch.full((spec.pattern.vocab_size,), (1 - p) / (spec.pattern.vocab_size - 1))
    probs[token] = p
    return probs.log()


def test_a_repeated_greedy_choice_is_redrawn_from_the_raw_distribution():
    past = np.array([[9] * K] * 3 + [[7, 7, 7, 7], [1, 6, 2, 3], [7, 4, 7, 5]])  # window 3: 7 twice in streams 0, 2
    out = step_once(400, [], logits_favouring(7, 0.5), past)
    kept, redrawn = out[:, [1, 3]], out[:, [0, 2]]
    assert (kept == 7).all(), "7 appears once in the window of streams 1 and 3: greedy stands"
    share = (redrawn == 7).mean()
    assert 0.42 < share < 0.58, f"redraws follow the raw distribution (p(7) = 0.5), got {share:.3f}"
    others = redrawn[redrawn != 7]
    assert len(np.unique(others)) > 20, "the other half spreads over the whole vocabulary, BOS/EOS included"


def test_bos_and_eos_in_the_window_never_count():
    past = np.array([[BOS] * K, [EOS] * K, [EOS] * K, [EOS] * K])  # every stream: EOS x3 in the window
    out = step_once(50, [], logits_favouring(EOS, 0.9), past)
    assert (out == EOS).all()


def test_the_window_reaches_into_the_prompt_audio():
    history = [[11] * K, [11] * K]  # the voice prompt's last two steps
    past = np.full((K, K), BOS)  # the first generated steps (BOS while each stream waits its delay)
    out = step_once(300, history, logits_favouring(11, 0.3), past, repetition=(8, 2))
    assert 0.22 < (out == 11).mean() < 0.38, "11 twice in the prompt's audio: every first choice is redrawn"
    plain = step_once(300, [], logits_favouring(11, 0.3), past, repetition=(8, 2))
    assert (plain == 11).all(), "without the prompt's audio nothing repeats"


def test_off_without_a_setting():
    past = np.array([[7] * K] * 6)
    out = step_once(20, [], logits_favouring(7, 0.5), past, repetition=None)
    assert (out == 7).all()


def test_a_redraw_keeps_the_rules_where_the_vocabulary_is_closed():
    """speechctl's own layout: only the first codebook may end the audio, and no codebook may
    take BOS or PAD where a code belongs. Raw logits favour code 7 (0.5) and EOS (0.4): greedy
    takes 7 everywhere, 7 repeats, and the redraw from the raw logits stays a code in the other
    codebooks (an EOS there once made a frame the layout refuses: repetition.py), while the first
    codebook's redraw may end the audio."""
    spec = StreamSpec(DelayPattern((0, 1, 2, 3), codebook_size=32), bos_id=1, eos_id=2, pad_id=0,
                      audio_bos_id=3, audio_id=4, audio_eos_id=5)
    p = spec.pattern
    probs = torch.full((p.vocab_size,), 0.1 / (p.vocab_size - 2))
    probs[7], probs[p.eos] = 0.5, 0.4
    past = np.array([[7, p.bos, p.bos, p.bos], [7, 7, p.bos, p.bos], [7, 7, 7, p.bos], [7, 7, 7, 7], [7, 7, 7, 7]])
    out = step_once(300, [], probs.log(), past, repetition=(3, 2), spec=spec)
    assert (out[:, 1:] < p.codebook_size).all(), "a code where only a code may stand"
    redrawn = out[:, 1:] != 7
    assert 0.05 < redrawn.mean() < 0.35, "the others' redraws follow the raw logits over the codes"
    assert 0.3 < (out[:, 0] == p.eos).mean() < 0.5, "the first codebook may end the audio: its redraw keeps EOS"
    assert np.isin(out[:, 0], [p.bos, p.pad]).sum() == 0
