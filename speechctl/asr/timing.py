"""Word timestamps from the cross-attention of Whisper's alignment heads, by dynamic time warping
(OpenAI's ``whisper/timing.py``: ``find_alignment`` and ``add_word_timestamps``).

vLLM does not expose attention weights, so once a window's tokens are final they go through a
second, teacher-forced pass in transformers (:class:`Aligner`): one forward per window of
``<|startoftranscript|> [language, task] <|notimestamps|> text <|endoftext|>``, many windows per
call, on the engine's device. It costs about one more encoder pass and one decoder pass per
window (the decoder over the whole text at once), and the model's weights a second time.

Per window: the alignment heads' cross-attention over the audio's frames (softmax renormalised
to the frames that hold audio), standardised per frame over tokens, median-filtered (width 7)
along time, averaged over heads; DTW through minus that matrix gives each token's first frame;
a word starts at its first token's time and ends at the next word's start. Words are tokens
split at spaces (at unicode boundaries for zh/ja/th/lo/my/yue), punctuation merged into its
neighbour, and OpenAI's boundary rules clip words longer than twice the median.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from speechctl.asr.segments import RATE, Segment, Word
from speechctl.asr.vocab import NO_SPACE_LANGUAGES, WhisperVocab

HOP = 160  # log-mel frames of 10 ms
FRAMES_PER_TOKEN = 2  # encoder positions are 20 ms
TOKENS_PER_SECOND = RATE / HOP / FRAMES_PER_TOKEN  # 50
MEDFILT_WIDTH = 7
PREPEND = "\"'“¿([{-"
APPEND = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END = ".。!！?？"


@dataclass
class WordTiming:
    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


@dataclass
class AlignItem:
    audio: np.ndarray  # the window's samples at 16 kHz
    text_tokens: list[int]
    sot_sequence: list[int]  # <|startoftranscript|> [language, task]
    language: str | None


# --------------------------------------------------------------------------------------------
# The method, on one window's attention
# --------------------------------------------------------------------------------------------


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a window of ``width`` along the last dimension, reflect-padded."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    shape = x.shape
    y = F.pad(x.reshape(1, -1, shape[-1]), (pad, pad), mode="reflect")
    return y.unfold(-1, width, 1).sort(dim=-1).values[..., pad].reshape(shape)


def dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through cost matrix ``x`` [N, M] (OpenAI's ``dtw_cpu`` with its
    tie rules), computed one anti-diagonal at a time. Returns (token indices, frame indices)."""
    N, M = x.shape
    cost = np.full((N + 1, M + 1), np.inf)
    trace = np.full((N + 1, M + 1), -1, np.int8)
    cost[0, 0] = 0
    x = x.astype(np.float64)
    for d in range(2, N + M + 1):
        i = np.arange(max(1, d - M), min(N, d - 1) + 1)
        j = d - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        t = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        cost[i, j] = x[i - 1, j - 1] + np.choose(t, [c0, c1, c2])
        trace[i, j] = t
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = N, M
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    path = np.array(path[::-1]).T
    return path[0], path[1]


def token_frames(weights: torch.Tensor, num_frames: int, sot_len: int) -> tuple[np.ndarray, np.ndarray]:
    """DTW of one window: ``weights`` [heads, tokens, 1500] cross-attention probabilities of the
    alignment heads for the whole teacher-forced sequence. Returns (text indices, time indices)
    of the path, rows from the <|notimestamps|> position to the last text token."""
    w = weights[:, :, : num_frames // FRAMES_PER_TOKEN].double()
    w = w / w.sum(dim=-1, keepdim=True)  # = softmax over the frames that hold audio
    std, mean = torch.std_mean(w, dim=-2, keepdim=True, unbiased=False)
    w = (w - mean) / std
    w = median_filter(w, MEDFILT_WIDTH)
    matrix = w.mean(dim=0)[sot_len:-1]
    return dtw(-matrix.cpu().numpy())


def split_words(tokens: list[int], vocab: WhisperVocab, decode, language: str | None) -> tuple[list[str], list[list[int]]]:
    """Words and their tokens (OpenAI's ``split_to_word_tokens``; ``decode`` keeps special
    tokens)."""
    full = decode(tokens)
    words, word_tokens, current, offset = [], [], [], 0
    for token in tokens:  # at unicode boundaries first
        current.append(token)
        text = decode(current)
        if "\ufffd" not in text or full[offset + text.index("\ufffd")] == "\ufffd":
            words.append(text)
            word_tokens.append(current)
            current = []
            offset += len(text)
    if language in NO_SPACE_LANGUAGES:
        return words, word_tokens
    out_words, out_tokens = [], []
    for sub, sub_tokens in zip(words, word_tokens):
        special = sub_tokens[0] >= vocab.eot
        if special or sub.startswith(" ") or sub.strip() in string.punctuation or not out_words:
            out_words.append(sub)
            out_tokens.append(list(sub_tokens))
        else:
            out_words[-1] += sub
            out_tokens[-1].extend(sub_tokens)
    return out_words, out_tokens


def word_timings(text_tokens: list[int], text_indices, time_indices, token_probs: list[float], vocab, decode, language) -> list[WordTiming]:
    words, word_tokens = split_words(text_tokens + [vocab.eot], vocab, decode, language)
    if len(word_tokens) <= 1:
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    starts, ends = jump_times[boundaries[:-1]], jump_times[boundaries[1:]]
    probs = [float(np.mean(token_probs[i:j])) for i, j in zip(boundaries[:-1], boundaries[1:])]
    return [WordTiming(w, t, float(s), float(e), p) for w, t, s, e, p in zip(words, word_tokens, starts, ends, probs)]


def merge_punctuations(alignment: list[WordTiming]) -> None:
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        previous, following = alignment[i], alignment[j]
        if previous.word.startswith(" ") and previous.word.strip() in PREPEND:
            following.word = previous.word + following.word
            following.tokens = previous.tokens + following.tokens
            previous.word, previous.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        previous, following = alignment[i], alignment[j]
        if not previous.word.endswith(" ") and following.word in APPEND:
            previous.word = previous.word + following.word
            previous.tokens = previous.tokens + following.tokens
            following.word, following.tokens = "", []
        else:
            i = j
        j += 1


def place_words(segments: list[Segment], alignment: list[WordTiming], offset: float, last_speech: float, eot: int) -> float:
    """OpenAI's ``add_word_timestamps`` after the alignment: clip long words, merge punctuation,
    hand each segment its words and fit its start/end to them. Returns the last speech time."""
    durations = np.array([t.end - t.start for t in alignment])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    if len(durations):
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > longest:
                if alignment[i].word in SENTENCE_END:
                    alignment[i].end = alignment[i].start + longest
                elif alignment[i - 1].word in SENTENCE_END:
                    alignment[i].start = alignment[i].end - longest
    merge_punctuations(alignment)
    index = 0
    for segment in segments:
        text_tokens = [t for t in segment.tokens if t < eot]
        saved, words = 0, []
        while index < len(alignment) and saved < len(text_tokens):
            timing = alignment[index]
            if timing.word:
                words.append(Word(timing.word, round(offset + timing.start, 2), round(offset + timing.end, 2), timing.probability))
            saved += len(timing.tokens)
            index += 1
        if words:
            if words[0].end - last_speech > median * 4 and (
                words[0].end - words[0].start > longest or (len(words) > 1 and words[1].end - words[0].start > longest * 2)
            ):
                if len(words) > 1 and words[1].end - words[1].start > longest:
                    boundary = max(words[1].end / 2, words[1].end - longest)
                    words[0].end = words[1].start = boundary
                words[0].start = max(0, words[0].end - longest)
            if segment.start < words[0].end and segment.start - 0.5 > words[0].start:
                words[0].start = max(0, min(words[0].end - median, segment.start))
            else:
                segment.start = words[0].start
            if segment.end > words[-1].start and segment.end + 0.5 < words[-1].end:
                words[-1].end = max(words[-1].start + median, segment.end)
            else:
                segment.end = words[-1].end
            last_speech = segment.end
        segment.words = words
    return last_speech


# --------------------------------------------------------------------------------------------
# The second pass
# --------------------------------------------------------------------------------------------


class Aligner:
    """transformers' Whisper on the engine's device, teacher-forced over final tokens for the
    alignment heads' cross-attention."""

    def __init__(self, model_dir, vocab: WhisperVocab, tokenizer, device: str, dtype: torch.dtype, batch: int = 8):
        from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

        self.vocab, self.tokenizer, self.device, self.dtype, self.batch = vocab, tokenizer, device, dtype, batch
        self.model = WhisperForConditionalGeneration.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="eager").to(device).eval()
        self.features = WhisperFeatureExtractor.from_pretrained(str(model_dir))
        layers, heads = self.model.config.decoder_layers, self.model.config.decoder_attention_heads
        # OpenAI's default when a checkpoint names none: every head of the upper half
        self.heads = list(vocab.alignment_heads) or [(l, h) for l in range(layers // 2, layers) for h in range(heads)]
        self.passes = 0

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    @torch.inference_mode()
    def attention(self, items: list[AlignItem]) -> list[tuple[torch.Tensor, list[float]]]:
        """Per item: the alignment heads' cross-attention [heads, tokens, 1500] and the text
        tokens' probabilities."""
        out = []
        for i in range(0, len(items), self.batch):
            chunk = items[i : i + self.batch]
            feats = self.features([c.audio for c in chunk], sampling_rate=RATE, return_tensors="pt").input_features
            seqs = [c.sot_sequence + [self.vocab.no_timestamps] + c.text_tokens + [self.vocab.eot] for c in chunk]
            width = max(map(len, seqs))
            ids = torch.tensor([s + [self.vocab.eot] * (width - len(s)) for s in seqs])  # right padding: causal
            result = self.model(
                input_features=feats.to(self.device, self.dtype), decoder_input_ids=ids.to(self.device), output_attentions=True
            )
            self.passes += 1
            cross = result.cross_attentions  # per layer [N, heads, tokens, 1500]
            weights = torch.stack([cross[l][:, h] for l, h in self.heads], dim=1).float()  # [N, H, T, 1500]
            logits = result.logits.float()
            for k, (c, s) in enumerate(zip(chunk, seqs)):
                begin = len(c.sot_sequence)
                probs = logits[k, begin : begin + len(c.text_tokens), : self.vocab.eot].softmax(dim=-1)
                token_probs = probs[torch.arange(len(c.text_tokens)), torch.tensor(c.text_tokens)].tolist()
                out.append((weights[k, :, : len(s)].cpu(), token_probs))
        return out

    def align(self, items: list[AlignItem]) -> list[list[WordTiming]]:
        results = []
        todo = [k for k, c in enumerate(items) if c.text_tokens]
        attention = dict(zip(todo, self.attention([items[k] for k in todo])))
        for k, item in enumerate(items):
            if k not in attention:
                results.append([])
                continue
            weights, probs = attention[k]
            num_frames = len(item.audio) // HOP
            text_idx, time_idx = token_frames(weights, num_frames, len(item.sot_sequence))
            results.append(word_timings(item.text_tokens, text_idx, time_idx, probs, self.vocab, self.decode, item.language))
        return results
