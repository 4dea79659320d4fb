"""Batching that stays exact: a frame-synchronous model (a codec's decoder or encoder) applied to
items of different lengths in few calls, each item's output what running it alone gives, and
the receptive field that makes that possible, measured.

Why that takes care: the encoders and decoders are convolution stacks whose layers zero-pad at the
ends of the sequence. Right-padding a short item with extra frames to batch it with longer ones
changes its last outputs (its last layers see the padding frames' activations instead of zeros).
Left context matters the same way at the start of a sequence. See ``run_exact_batched``.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Callable, Sequence

import torch

Context = tuple[int, int]
BatchFn = Callable[[torch.Tensor], torch.Tensor]

# Probe lengths (frames) tried in turn when measuring a receptive field. The first fits every
# codec speechctl ships or benches (DAC's and Higgs' tokenizer's 10-11 frames a side) and costs
# half the next: a codec measures at load, so this is start-up time (the voice's codec loads in
# 0.16 s instead of 0.35 s on a 2-core CPU).
_PROBE_FRAMES = (32, 64, 256, 1024, 4096)
# A receptive field side that is the whole input (a codec sets it where it does not measure:
# attention or a recurrence over everything before); measured sides are at most 2048.
UNBOUNDED = 1 << 40  # frames


def bounded(context: Context) -> bool:
    """Whether both sides of a receptive field are finite (windows of it are exact)."""
    return max(context) < UNBOUNDED


def run_exact_batched(
    items: Sequence[torch.Tensor],
    run: BatchFn,
    *,
    in_per_frame: int,
    out_per_frame: int,
    context: Context,
    max_batch_frames: int,
    window: int | None = None,
    pad_to: Sequence[int] = (),
) -> list[torch.Tensor]:
    """Apply a frame-synchronous sequence model to items of different lengths, batched and exact.

    ``items[i]`` is ``[..., n_i * in_per_frame]`` (time last, ``n_i >= 1`` frames); ``run`` maps an
    equal-length batch ``[B, ..., n * in_per_frame]`` to ``[B, ..., n * out_per_frame]``.
    ``context = (left, right)``: output frame ``t`` depends on input frames ``t-left .. t+right``.
    Returns ``[..., n_i * out_per_frame]`` per item, equal to ``run`` on that item alone.

    How, with few calls whatever the mix of lengths:

    1. Items of at least ``W = left + right`` frames, longest first, are right-padded into
       batches of up to ``max_batch_frames`` padded frames: one call per batch. An item's frames
       ``t < n - right`` are exact: they see neither the padding nor its effect on any layer.
    2. For each of those items shorter than its batch, the last ``W`` frames are run again as a
       window with the item's natural end; all windows have ``W`` frames, so they batch together
       (one call). The window's last ``right`` frames are at least ``left`` frames past its own
       start, so they are exact, and replace the item's last ``right`` frames.
    3. Items shorter than ``W`` have no window with both a natural end and enough left context;
       they run in groups of equal length (no padding). Codecs' windows are a fraction of a
       second, so these are rare in speech.

    With ``right == 0`` (causal models) padding never reaches back and step 1 alone is exact.

    ``window``: an item longer than ``window`` frames is run as windows of exactly that many
    (``_fixed_windows``), so that every call has few distinct shapes (decode graphs); ``None``:
    items run whole. ``pad_to``: the lengths step 1 pads a batch to, the least at least its
    longest item's (none: that item's; an item longer than all: its own).
    """
    left, right = context
    lengths = [item.shape[-1] // in_per_frame for item in items]
    if any(n < 1 or item.shape[-1] != n * in_per_frame for n, item in zip(lengths, items)):
        raise ValueError(f"items must be whole frames of {in_per_frame} and non-empty")
    if window is not None and any(n > window for n in lengths):
        return _run_in_windows(items, lengths, run, in_per_frame=in_per_frame, out_per_frame=out_per_frame,
                               context=context, max_batch_frames=max_batch_frames, window=window, pad_to=pad_to)
    window = left + right

    def padded(frames: int) -> int:
        i = bisect.bisect_left(pad_to, frames)
        return pad_to[i] if i < len(pad_to) else frames

    outputs: list[torch.Tensor | None] = [None] * len(items)

    def run_batch(indices: list[int], frames: int, start_of: Callable[[int], int]) -> torch.Tensor:
        length = frames * in_per_frame
        batch = torch.stack([pad_end(items[i][..., start_of(i) * in_per_frame :], length) for i in indices])
        with torch.no_grad():
            return run(batch)

    # 1. Long items (all items if causal): padded batches, longest first.
    long_items = [i for i, n in enumerate(lengths) if right == 0 or n >= window]
    long_items.sort(key=lambda i: -lengths[i])
    needs_tail: list[int] = []
    for chunk in _chunks(long_items, lambda first: padded(lengths[first]), max_batch_frames):
        frames = padded(lengths[chunk[0]])
        batch_out = run_batch(chunk, frames, lambda i: 0)
        for row, i in enumerate(chunk):
            outputs[i] = batch_out[row, ..., : lengths[i] * out_per_frame].clone()
            if right > 0 and lengths[i] < frames:
                needs_tail.append(i)

    # 2. Tail windows of W frames with each item's natural end.
    for chunk in _chunks(needs_tail, lambda first: window, max_batch_frames):
        batch_out = run_batch(chunk, window, lambda i: lengths[i] - window)
        for row, i in enumerate(chunk):
            exact_tail = batch_out[row, ..., left * out_per_frame :]
            outputs[i][..., (lengths[i] - right) * out_per_frame :] = exact_tail

    # 3. Short items: groups of equal length.
    groups: dict[int, list[int]] = defaultdict(list)
    for i, n in enumerate(lengths):
        if outputs[i] is None:
            groups[n].append(i)
    for frames, group in groups.items():
        for chunk in _chunks(group, lambda first: frames, max_batch_frames):
            batch_out = run_batch(chunk, frames, lambda i: 0)
            for row, i in enumerate(chunk):
                outputs[i] = batch_out[row].clone()
    return outputs  # type: ignore[return-value]


def _fixed_windows(frames: int, window: int, left: int, right: int) -> list[tuple[int, int, int]]:
    """How an item of ``frames`` > ``window`` frames is run as windows of ``window`` frames, each
    giving ``keep`` exact frames after skipping ``skip``: (start, skip, keep) per window.

    The first starts at frame 0 (the item's natural start) and keeps all but its last ``right``
    frames; each next one starts ``left`` frames before what is not kept yet; the last ends at
    the item's natural end and keeps the rest. Every kept frame sees ``left`` frames before it
    (or the natural start) and ``right`` after it (or the natural end) inside its window."""
    if window <= left + right:
        raise ValueError(f"a window of {window} frames keeps nothing with context ({left}, {right})")
    spans, done = [], 0
    while done < frames:
        start = max(0, done - left)
        if start + window >= frames:  # the last: aligned to the natural end
            start = frames - window
            spans.append((start, done - start, frames - done))
            done = frames
        else:
            kept_to = start + window - right
            spans.append((start, done - start, kept_to - done))
            done = kept_to
    return spans


def _run_in_windows(items, lengths, run, *, in_per_frame, out_per_frame, context, max_batch_frames, window, pad_to):
    """``run_exact_batched`` with each item longer than ``window`` frames cut into windows of
    exactly ``window`` frames (``_fixed_windows``), its outputs stitched from their kept frames."""
    left, right = context
    pieces, spans = [], []  # per item: [(piece index, skip, keep)]
    for item, n in zip(items, lengths):
        cuts = _fixed_windows(n, window, left, right) if n > window else [(0, 0, n)]
        spans.append([])
        for start, skip, keep in cuts:
            size = window if n > window else n
            spans[-1].append((len(pieces), skip, keep))
            pieces.append(item[..., start * in_per_frame : (start + size) * in_per_frame])
    outputs = run_exact_batched(pieces, run, in_per_frame=in_per_frame, out_per_frame=out_per_frame,
                                context=context, max_batch_frames=max_batch_frames, pad_to=pad_to)
    return [torch.cat([outputs[p][..., skip * out_per_frame : (skip + keep) * out_per_frame] for p, skip, keep in cuts], dim=-1)
            for cuts in spans]


def measure_context(
    run: BatchFn,
    make_probe: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    *,
    out_per_frame: int,
    margin: int = 1,
) -> Context:
    """Measure a frame-synchronous model's receptive field ``(left, right)`` in frames.

    ``make_probe(frames)`` returns a random input ``[1, ..., frames * in_per_frame]`` and a copy
    changed only in frame ``frames // 2``; ``run`` maps ``[B, ..., N]`` inputs to
    ``[B, C, frames * out_per_frame (+- a few)]`` float outputs. The output samples that change
    span frames ``mid - right .. mid + left``. The input is run twice in the same batch to read
    the noise floor of the device (zero on CPU): only changes above it count. The probe grows
    until the change stays clear of its ends.

    ``margin`` frames are added to each nonzero side: the boundary effects a window must avoid
    (zero padding inside the network) start at sub-frame offsets that whole-frame measurement
    can round away. A side measured as 0 (a causal model) stays 0.
    """
    for frames in _PROBE_FRAMES:
        middle = frames // 2
        base, changed = make_probe(frames)
        with torch.no_grad():
            out = run(torch.cat([base, base, changed]))
        out = out.reshape(out.shape[0], -1, out.shape[-1])
        noise_floor = (out[1] - out[0]).abs().max()
        difference = (out[2] - out[0]).abs().amax(dim=0)
        changed_at = torch.nonzero(difference > noise_floor).flatten()
        if changed_at.numel() == 0:
            raise RuntimeError("changing one frame of the input did not change the output")
        first, last = int(changed_at[0]), int(changed_at[-1])
        if first >= out_per_frame and last < out.shape[-1] - out_per_frame:
            left = last // out_per_frame - middle
            right = middle - first // out_per_frame
            return (left + margin if left > 0 else 0, right + margin if right > 0 else 0)
    raise RuntimeError(f"receptive field wider than {_PROBE_FRAMES[-1] // 2} frames")


def pad_end(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad (or trim) the last axis to ``length``."""
    if tensor.shape[-1] >= length:
        return tensor[..., :length]
    return torch.nn.functional.pad(tensor, (0, length - tensor.shape[-1]))


def frames_within(budget_bytes: int, bytes_per_frame: float, most: int, least: int = 64) -> int:
    """The most frames (items x padded frames) one call may take for its activations to stay
    within ``budget_bytes`` at ``bytes_per_frame`` (a convolution stack's activations grow with its
    frames), at most ``most`` and at least ``least`` (a call always takes one item, see
    ``_chunks``)."""
    fit = int(budget_bytes // max(bytes_per_frame, 1.0))
    return max(min(least, most), min(most, fit))


def _chunks(indices: list[int], frames_per_item: Callable[[int], int], budget: int) -> list[list[int]]:
    """Split ``indices`` (in order) into runs of at most ``budget`` padded frames.

    A run's cost is its size times ``frames_per_item`` of its first index (the longest, as
    callers sort longest first). A run always takes one index, so an item over budget still runs.
    """
    chunks: list[list[int]] = []
    for index in indices:
        if chunks and (len(chunks[-1]) + 1) * frames_per_item(chunks[-1][0]) <= budget:
            chunks[-1].append(index)
        else:
            chunks.append([index])
    return chunks
