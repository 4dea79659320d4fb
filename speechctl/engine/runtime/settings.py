"""The live requests' settings, per slot and counted on the host.

``SamplingColumns`` hold each slot's sampling settings on the device (the per-step work reads them
by slot); ``LiveSettings`` counts the settings of the requests alive in the engine, so that the
per-step work runs only the kernels some row needs and its graphs are keyed by exactly those
facts. Both change when requests join or leave the batch, never per step.
"""

from __future__ import annotations

from collections import Counter

import torch

from speechctl.engine.params import Sampling, StreamParams


class SamplingColumns:
    """One stream group's sampling settings (audio, text, or a depth decoder's codebooks) for
    every slot: temperature 0 = greedy, top-k 0 and top-p 1 = off."""

    def __init__(self, n: int, device: torch.device, temperature: float):
        self.temperature = torch.full((n,), temperature, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(n, dtype=torch.int64, device=device)
        self.top_p = torch.ones(n, dtype=torch.float32, device=device)

    def at(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[R] slots -> the rows' (temperature, top_k, top_p)."""
        return self.temperature[slots], self.top_k[slots], self.top_p[slots]

    def columns(self, samplings: list[Sampling]) -> list[tuple[torch.Tensor, list]]:
        return [(self.temperature, [s.temperature for s in samplings]), (self.top_k, [s.top_k for s in samplings]),
                (self.top_p, [s.top_p for s in samplings])]


# Sampling flags under which ``sample_streams`` handles every row's settings (greedy or not, any
# top-k, any top-p): the same tokens as the specialized paths (noise is keyed by token id).
GENERAL_SAMPLING = {"any_random": True, "all_random": False, "any_filter": True, "max_top_k": 0, "any_top_p": True}
# The same for batches whose every row is greedy (a depth decoder's, where the general path would
# run its extra work once per codebook, 31 times a step).
GREEDY_SAMPLING = {"any_random": False, "all_random": False, "any_filter": False, "max_top_k": 0, "any_top_p": False}
# The general path's candidate sets: while every random row has a top-k of at most 64 (the
# families' defaults: 45-50), each row's tokens come from one ``topk(64)`` rather than a ``topk`` of
# the whole codebook (~6x the work per row); otherwise every token. Listed as the top-k a request
# needs for each (0: none, so every token). Each set is one more graph per batch size, recorded
# at start-up, and all of them one compile: ``sample_streams`` takes the count as a symbolic size.
CANDIDATE_SETS = (64, 0)


def candidate_set(max_top_k: int, vocab: int) -> int:
    """The general path's candidate count (its ``max_top_k``) for live rows that need
    ``max_top_k`` candidates (0: every token) of a ``vocab``-token codebook. Every token is
    ``vocab`` itself, not 0, so that both sets take one code path; and not a larger stand-in,
    which a compiled step loaded from inductor's cache would guard against (its guards assume
    the count within the vocabulary)."""
    return next((min(n, vocab) for n in CANDIDATE_SETS if 0 < max_top_k <= n), vocab)


def general_audio_sampling(device: torch.device) -> bool:
    """Whether the audio codebooks always take the general sampling path (``LiveSettings``): on
    CUDA, where every specialized path would be one more graph per batch size."""
    return device.type == "cuda"


class LiveSettings:
    """Host-side counts over the live requests' settings. They let the per-step work skip what no
    row needs (``sampling_flags``) and they key its graphs (``graph_key``); updated on admission
    and release only.

    With ``general_audio`` (on CUDA) the audio codebooks always take the general path: one
    compiled function and one graph per batch size and candidate set (``CANDIDATE_SETS``)
    whatever the requests' sampling, so a workload of varied settings records nothing after
    start-up. A depth decoder's codebooks (CSM: 31 sampled one after another) take it too where
    some row samples them, and argmax alone where none does; only such a model's graphs are keyed
    by them (``depth_decoder``)."""

    def __init__(self, vocab: int, general_audio: bool = False, depth_decoder: bool = False):
        self._derived: dict = {}  # sampling_flags and graph_key, derived again after any change
        self.general_audio = general_audio
        self.vocab = vocab  # tokens of a codebook's sampled vocabulary (the general path's every-token count)
        self.depth_decoder = depth_decoder  # the model samples depth codebooks (CSM): they key its graphs
        self.live = 0
        self.random = {False: 0, True: 0}  # rows sampling at temperature > 0: audio, depth
        self.unbounded = {False: 0, True: 0}  # of those, rows with no top-k: they may draw any token
        self.top_ks: dict[bool, Counter[int]] = {False: Counter(), True: Counter()}  # of rows that filter
        self.top_ps = {False: 0, True: 0}  # rows with top_p < 1
        self.paired = 0  # members of CFG pairs
        self.repetition = 0  # rows with repetition-aware sampling
        self.cfg_filter = 0  # pair members using Dia's CFG top-k filter
        self.text_random = 0  # pair members sampling text at temperature > 0

    def __setattr__(self, name, value):
        # The per-step work asks for the flags and the graph key every step, and they change
        # only when the counts do: derive them once per change (host time is the c=64 step's
        # bottleneck), whether the change comes from ``count`` or a field set outright.
        if name != "_derived":
            self._derived = {}
        super().__setattr__(name, value)

    def count(self, params: StreamParams, sign: int) -> None:
        self._derived = {}
        self.live += sign
        for deep, sampling in ((False, params.audio), (True, params.depth or params.audio)):
            self.random[deep] += sign * (sampling.temperature > 0)
            self.unbounded[deep] += sign * (sampling.temperature > 0 and sampling.top_k == 0)
            if sampling.filters:
                self.top_ks[deep][sampling.top_k] += sign
            self.top_ps[deep] += sign * (sampling.top_p < 1)
        self.repetition += sign * (params.repetition is not None)
        if params.partner is not None:
            self.paired += sign
            self.cfg_filter += sign * (params.guidance.top_k > 0)
            self.text_random += sign * (params.text.temperature > 0)

    def sampling_flags(self, depth: bool = False) -> dict:
        """For ``sample_streams``: whether some / every live row samples at temperature > 0,
        whether some filters, how many candidates the random rows need (the largest top-k; 0,
        a full sort, if one samples without a top-k: it may draw any token), whether some
        filters by top-p. The general path (on CUDA) takes the smallest ``CANDIDATE_SETS`` entry
        that holds them."""
        flags = self._derived.get(depth)
        if flags is None:
            flags = self._derived[depth] = self._sampling_flags(depth)
        return dict(flags)

    def _sampling_flags(self, depth: bool) -> dict:
        ks = [k for k, n in self.top_ks[depth].items() if n > 0]
        max_top_k = max(ks) if ks and not self.unbounded[depth] else 0
        random = self.random[depth]
        if self.general_audio and depth and not random:
            return dict(GREEDY_SAMPLING)  # a depth decoder's 31 codebooks, greedy: argmax alone
        if self.general_audio:
            return dict(GENERAL_SAMPLING, max_top_k=candidate_set(max_top_k, self.vocab))
        return {"any_random": random > 0, "all_random": 0 < random == self.live, "any_filter": bool(ks),
                "max_top_k": max_top_k, "any_top_p": self.top_ps[depth] > 0}

    def graph_key(self) -> tuple:
        """Every host-side fact that changes which kernels the per-step work runs (the depth
        codebooks' only where the model has a depth decoder)."""
        key = self._derived.get("key")
        if key is None:
            key = self._derived["key"] = self._graph_key()
        return key

    def _graph_key(self) -> tuple:
        depth = self.sampling_flags(depth=True).values() if self.depth_decoder else ()
        return (*self.sampling_flags().values(), self.paired > 0, self.cfg_filter > 0, self.text_random > 0,
                self.repetition > 0, *depth)
