"""Training the speech LM in speechctl's own layout (``SpeechctlMultiStreamLM``), teacher-forced
exactly as speechctl's engine feeds and reads it.

One TTS example (text of n bytes, codes [K, T]; delays d, lead stream = smallest delay)::

    position  0     1       2 .. n+1   n+2          n+3 ..  n+2+S-1        (S = T + max(d) + 1)
    primary   <bos> <|tts|> text bytes <|audio_bos|> <|audio|> x (S-1)
    aux in    PAD   PAD     PAD        PAD          steps[:, 0 .. S-2]     (the delay layout)
    target    -     -       -          steps[:, 0]  steps[:, 1 .. S-1]

The input at position P+g (P = n+3) is generated step g: the primary ``<|audio|>`` plus the aux
tokens recorded at step g (``engine/runtime/inputs.py: inputs_at``); the logits at a position predict the
next step, the last prompt token predicting step 0 (``_sample_step``). The last step (every stream
past its EOS) is never an input. Losses count where the engine samples: the code positions of
every stream and the lead stream's EOS; everything else (BOS before a delay, the other streams'
EOS and PAD) the engine forces. The logits are masked as the engine masks them (codes; EOS on
the lead stream only), so training and sampling see the same choices.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recipes.voice.align import AttentionProbe, word_spans
from recipes.voice.checkpoint import environment, load_state, read_record, save_state, write_record
from recipes.voice.codes import CodeSplit, load_codes
from recipes.voice.config import ConfigError, LMShape, Recipe, multistream_recipe
from recipes.voice.schedule import RunSchedule, ramp, resumed_rate
from recipes.voice.text import bare, bare_variant


def skeleton(recipe: Recipe, path: Path, max_piece_chars: int | None = None) -> Path:
    """speechctl's checkpoint directory for this recipe without LM weights (config.json with its
    ``speechctl`` section, tokenizer, a placeholder codec): the training model is built from
    this config.json, so training and export cannot disagree on it. ``max_piece_chars``: the
    export's (what the voice speaks per request; not the LM's)."""
    from speechctl.models.generic.checkpoint import create_multistream_checkpoint

    check_delays(recipe.lm)
    return create_multistream_checkpoint(path, multistream_recipe(
        recipe.lm, recipe.codec, weights=False, text_input=recipe.lm_train.text_input, phoneme_voice=recipe.data.voice,
        max_piece_chars=max_piece_chars))


def check_delays(lm: LMShape) -> None:
    if lm.delays is not None:
        lead = min(lm.delays)
        if sorted(lm.delays).count(lead) > 1:
            # Two streams at the lead's delay: the engine lets only the lead end the audio, so
            # the other one could never emit its EOS in time.
            raise ValueError(f"delays {lm.delays}: only one stream may have the smallest delay")


@dataclass(frozen=True)
class Layout:
    """The token ids a TTS example is made of (from config.json's ``speechctl`` section)."""

    bos: int
    tts: int
    audio_bos: int
    audio: int
    pad: int  # primary id of padding positions (never attended to, never scored)
    delays: tuple[int, ...]
    codebook_size: int

    @classmethod
    def from_config(cls, config) -> "Layout":
        s = config.speechctl
        t = s["tokens"]
        return cls(t["bos"], s["tasks"]["tts"], t["audio_bos"], t["audio"], t["pad"], tuple(s["delays"]),
                   int(s["codebook_size"]))

    @property
    def K(self) -> int:
        return len(self.delays)

    @property
    def Va(self) -> int:
        return self.codebook_size + 3

    @property
    def BOS(self) -> int:
        return self.codebook_size

    @property
    def EOS(self) -> int:
        return self.codebook_size + 1

    @property
    def PAD(self) -> int:
        return self.codebook_size + 2

    @property
    def lead(self) -> int:
        return int(np.argmin(self.delays))

    def length(self, text_bytes: int, frames: int) -> int:
        """Positions of an example: prompt (n + 3) + the S - 1 steps that are inputs."""
        return text_bytes + 3 + frames + max(self.delays)

    def allowed(self, device) -> torch.Tensor:
        """[K, Va] 0 where the engine may sample, -inf where it never does (BOS, PAD; EOS off the
        lead stream)."""
        mask = torch.zeros(self.K, self.Va, device=device)
        mask[:, self.BOS] = mask[:, self.PAD] = float("-inf")
        mask[:, self.EOS] = float("-inf")
        mask[self.lead, self.EOS] = 0.0
        return mask


class Examples:
    """A split's text bytes and codes on the device, built into batches there."""

    def __init__(self, split: CodeSplit, layout: Layout, device, max_tokens: int | None = None):
        self.layout = layout
        self.text = list(split.text)  # what the LM reads
        text = [t.encode("utf-8") for t in split.text]
        lengths = np.array([layout.length(len(b), int(f)) for b, f in zip(text, split.frames)], dtype=np.int64)
        keep = np.ones(len(text), bool) if max_tokens is None else lengths <= max_tokens
        self.ids = np.flatnonzero(keep)  # utterances used (others are too long)
        self.dropped = int((~keep).sum())
        self.lengths = lengths
        text_len = np.array([len(b) for b in text], dtype=np.int64)
        text_start = np.concatenate([[0], np.cumsum(text_len)[:-1]]) if len(text) else text_len
        flat = np.frombuffer(b"".join(text), dtype=np.uint8).astype(np.int64)
        as_t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
        self.text_flat = as_t(flat if flat.size else np.zeros(1, np.int64))
        self.text_start, self.text_len = as_t(text_start), as_t(text_len)
        self.codes = as_t(split.codes.astype(np.int64))  # [K, F]
        self.code_start, self.frames = as_t(split.offset), as_t(split.frames)
        self.delays = as_t(np.array(layout.delays, dtype=np.int64))
        self.device = device
        # The characters each frame reads (align.py), where the data has espeak-ng's word starts.
        self.spans = None
        if split.words is not None:
            self.spans = as_t(word_spans(split.words, split.word_counts, split.offset, split.frames))

    def __len__(self) -> int:
        return len(self.ids)

    def batch(self, ids: torch.Tensor, length: int, unconditional: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Utterances ``ids`` [B] right-padded to ``length`` positions: ``primary`` [B, L],
        ``aux`` [B, L, K] (inputs), ``target`` [B, L, K], ``weight`` [B, L, K] (bool);
        ``unconditional`` [B] (bool): those rows with their condition dropped (``text_dropout``)."""
        lay = self.layout
        j = torch.arange(length, device=self.device)[None, :]  # [1, L]
        n = self.text_len[ids][:, None]
        P = n + 3
        T = self.frames[ids][:, None]
        end = P + T + max(lay.delays)  # first padding position
        text_at = self.text_flat[(self.text_start[ids][:, None] + j - 2).clamp(0, self.text_flat.numel() - 1)]
        primary = torch.full_like(j.expand(len(ids), -1), lay.pad)
        primary = torch.where(j < end, lay.audio, primary)
        primary = torch.where(j == P - 1, lay.audio_bos, primary)
        primary = torch.where((j >= 2) & (j < P - 1), text_at, primary)
        primary = torch.where(j == 1, lay.tts, primary)
        primary = torch.where(j == 0, lay.bos, primary)
        if unconditional is not None:  # [PAD] * (P - 1) + [audio BOS], the engine's CFG partner
            primary = torch.where(unconditional[:, None] & (j < P - 1), lay.pad, primary)

        start = self.code_start[ids][:, None, None]  # [B, 1, 1]
        d = self.delays[None, None, :]  # [1, 1, K]
        Tk = T[:, :, None]

        def steps_at(s):  # s [B, L] step index -> [B, L, K] the delay layout at that step
            f = s[:, :, None] - d  # frame of stream k at step s
            is_code = (f >= 0) & (f < Tk)
            code = self.codes[torch.arange(lay.K, device=self.device)[None, None, :],
                              (start + f.clamp(min=0)).clamp(max=self.codes.shape[1] - 1)]
            out = torch.where(f == Tk, lay.EOS, torch.where(f > Tk, lay.PAD, lay.BOS))
            return torch.where(is_code, code, out), f, is_code

        s_in = (j - P).expand(len(ids), -1)
        aux, _, _ = steps_at(s_in)
        aux = torch.where(((s_in >= 0) & (j < end))[:, :, None], aux, lay.PAD)
        s_out = s_in + 1
        target, f, is_code = steps_at(s_out)
        lead = torch.arange(lay.K, device=self.device)[None, None, :] == lay.lead
        weight = (is_code | (lead & (f == Tk))) & ((s_out >= 0) & (j < end))[:, :, None]
        batch = {"primary": primary, "aux": aux, "target": target, "weight": weight}
        if self.spans is not None:  # ``gold`` [B, L, 2]: the text positions the lead stream's next frame reads
            frame = s_out - lay.delays[lay.lead]
            at = (self.code_start[ids][:, None] + frame.clamp(min=0)).clamp(max=self.spans.shape[0] - 1)
            span = self.spans[at].to(torch.int64) + 2  # text byte c sits at position 2 + c
            has = (frame >= 0) & (frame < T) & (j < end) & (span[..., 1] > span[..., 0])
            if unconditional is not None:  # no text to read
                has = has & ~unconditional[:, None]
            batch["gold"] = torch.where(has[..., None], span, -1)
        return batch

    def epoch(self, batch_tokens: int, seed: int, epoch: int, pad_to: int = 16) -> list[tuple[np.ndarray, int]]:
        """This epoch's batches: (utterance ids, padded length), of at most ``batch_tokens``
        positions each; lengths grouped with some noise so that batches differ between epochs,
        batch order shuffled; a pure function of (seed, epoch)."""
        rng = np.random.default_rng([seed, epoch])
        lengths = self.lengths[self.ids]
        order = self.ids[np.argsort(lengths * rng.uniform(1.0, 1.15, size=len(lengths)), kind="stable")]
        batches, current, longest = [], [], 0
        for u in order:
            L = -(-int(self.lengths[u]) // pad_to) * pad_to
            if current and (len(current) + 1) * max(longest, L) > batch_tokens:
                batches.append((np.array(current), longest))
                current, longest = [], 0
            current.append(u)
            longest = max(longest, L)
        if current:
            batches.append((np.array(current), longest))
        rng.shuffle(batches)
        return batches


class SpeechLM(nn.Module):
    """The training twin of speechctl's ``MultiStreamForCausalLM``: a transformers backbone and
    the same parameters under the same names (``model.*``, ``lm_head``, ``audio_embed``,
    ``audio_head``), so its state dict is the checkpoint's ``model.safetensors``."""

    def __init__(self, config):
        super().__init__()
        import transformers

        config._attn_implementation = "sdpa"
        backbone = {"llama": transformers.LlamaModel, "qwen2": transformers.Qwen2Model,
                    "qwen3": transformers.Qwen3Model}[config.model_type]
        self.config = config
        self.model = backbone(config)
        K, Va = len(config.speechctl["delays"]), int(config.speechctl["codebook_size"]) + 3
        self.K, self.Va = K, Va
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.audio_embed = nn.Embedding(K * Va, config.hidden_size)
        self.audio_head = nn.Linear(config.hidden_size, K * Va, bias=False)
        std = config.initializer_range
        for w in (self.lm_head.weight, self.audio_embed.weight, self.audio_head.weight):
            nn.init.normal_(w, std=std)
        self.register_buffer("stream_offsets", torch.arange(K) * Va, persistent=False)

    def hidden(self, primary: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        """primary [B, L], aux [B, L, K] -> [B, L, H]; the input of a position is the sum of its
        K + 1 stream embeddings (as ``MultiStreamForCausalLM._embed_streams``)."""
        emb = self.model.embed_tokens(primary) + self.audio_embed(aux + self.stream_offsets).sum(dim=2)
        pos = torch.arange(primary.shape[1], device=primary.device)[None].expand(primary.shape[0], -1)
        return self.model(inputs_embeds=emb, position_ids=pos).last_hidden_state

    def aux_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., K, Va]"""
        return self.audio_head(hidden).unflatten(-1, (self.K, self.Va))

    def export_state(self, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()}


def stream_loss(model: SpeechLM, batch: dict, allowed: torch.Tensor, weights: torch.Tensor):
    """Cross-entropy of the scored positions under the engine's mask -> (loss, per-stream loss
    [K], per-stream accuracy [K], scored count [K])."""
    h = model.hidden(batch["primary"], batch["aux"])
    w = batch["weight"]
    scored = w.any(dim=-1)
    logits = model.aux_logits(h[scored]).float() + allowed  # [N, K, Va]
    w = w[scored]
    target = torch.where(w, batch["target"][scored], 0)
    ce = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none").view_as(target)
    ce = torch.where(w, ce, 0.0)
    count = w.sum(dim=0).clamp(min=1)
    per_stream = ce.sum(dim=0) / count
    acc = ((logits.argmax(dim=-1) == target) & w).sum(dim=0) / count
    loss = (per_stream * weights).sum() / weights.sum()
    return loss, per_stream.detach(), acc.detach(), w.sum(dim=0)


def as_read(split: CodeSplit, text_input: str, bare_share: float) -> CodeSplit:
    """``split`` with the text the LM reads: the sentence (a ``bare_share`` of them as typed,
    ``text.bare``) or its phonemes (likewise without the final full stop), the word starts moved
    onto what is read (an utterance whose phoneme words do not pair with espeak-ng's word events,
    as a number read as several words, keeps no word spans: the guided heads skip it)."""
    from dataclasses import replace

    from speechctl.phonemes import word_spans as phoneme_words

    is_bare = [bare_variant(t, bare_share) for t in split.text]
    if text_input == "text":
        return replace(split, text=[bare(t) if b else t for t, b in zip(split.text, is_bare)])
    if split.phonemes is None:
        raise ConfigError("lm_train.text_input=phonemes: these codes were made from data without phonemes "
                          "(make the data again)")
    read = [p[:-2] if b and p.endswith(" .") else p for p, b in zip(split.phonemes, is_bare)]
    words = None
    if split.words is not None:
        words = split.words.copy()
        first = np.concatenate([[0], np.cumsum(split.word_counts)[:-1]]).astype(np.int64)
        for u, phonemes in enumerate(read):
            n, at = int(split.word_counts[u]), int(first[u])
            spans = phoneme_words(phonemes)
            if len(spans) == n:
                words[at: at + n, :2] = spans
            else:
                words[at: at + n, :2] = 0
    return replace(split, text=read, words=words)


class LMTrainer:
    def __init__(self, recipe: Recipe, codes_dir: Path, work: Path, device: str, codes_sha256: str, log=print,
                 provenance: dict | None = None):
        """``provenance``: more of where the training data came from, written into every saved
        record (the stage's: the codec's and the audio's hashes)."""
        import transformers

        self.recipe, self.cfg, self.log = recipe, recipe.lm_train, log
        self.device = torch.device(device)
        self.codes_sha256 = codes_sha256
        self.provenance = dict(provenance or {})
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.skeleton = skeleton(recipe, Path(work) / "skeleton")
        config = transformers.AutoConfig.from_pretrained(self.skeleton)
        self.layout = Layout.from_config(config)
        config.attention_dropout = self.cfg.attention_dropout  # training only: the skeleton on disk keeps 0
        torch.manual_seed(self.cfg.seed)
        self.model = SpeechLM(config).to(self.device).train()
        train = as_read(load_codes(codes_dir, "train"), self.cfg.text_input, self.cfg.bare_text_share)
        self.train_set = Examples(train, self.layout, self.device, self.cfg.max_tokens)
        heldout = as_read(load_codes(codes_dir, "heldout"), self.cfg.text_input, 0.0)
        self.heldout = Examples(heldout, self.layout, self.device, self.cfg.max_tokens)
        if self.train_set.dropped:
            log(f"lm: {self.train_set.dropped} utterances longer than {self.cfg.max_tokens} positions left out")
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2 and "embed" not in n]
        rest = [p for n, p in self.model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
            lr=self.cfg.lr, betas=self.cfg.betas, fused=self.device.type == "cuda")
        self.allowed = self.layout.allowed(self.device)
        cw = self.cfg.codebook_weights or [1.0] * self.layout.K
        self.stream_weights = torch.tensor(cw, device=self.device)
        self.step, self.epoch, self.position, self.history, self.runs = 0, 0, 0, [], []
        self.resumed_at = None
        self.forward = torch.compile(stream_loss) if self.cfg.compile else stream_loss
        self.probe = None
        if self.cfg.align_weight > 0:
            if self.train_set.spans is None or self.cfg.compile:
                raise ConfigError("lm_train.align_weight needs codes made from data with word starts (made again "
                                  "since the data stage records them) and lm_train.compile off")
            self.probe = AttentionProbe(self.model.model, self.cfg.align_layer, self.cfg.align_heads)

    def parameters_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # -- checkpoints ------------------------------------------------------------------------------

    def resume(self, path: Path) -> None:
        record = read_record(path) or {}
        if record.get("codes_sha256") and record["codes_sha256"] != self.codes_sha256:
            self.log(f"lm: warning: {path} was trained on other codes ({record['codes_sha256'][:16]})")
        meta = load_state(path, {"lm": self.model}, {"lm": self.opt})
        self.step, self.epoch, self.position = meta["step"], meta["epoch"], meta["position"]
        self.history, self.runs = meta["history"], meta["runs"]
        if meta["resume"] != "exact":
            self.resumed_at = self.step
        self.log(f"lm: resumed at step {self.step} ({meta['resume']})")

    def save(self, path: Path) -> None:
        meta = {"step": self.step, "epoch": self.epoch, "position": self.position, "history": self.history,
                "runs": self.runs}
        resume = save_state(path, {"lm": self.model}, {"lm": self.opt}, meta)
        write_record(path, {
            "stage": "lm", "step": self.step, "epoch": self.epoch, "resume": resume,
            "recipe": self.recipe.to_dict(), "codes_sha256": self.codes_sha256, "runs": self.runs,
            "parameters": self.parameters_count(), "train_utterances": len(self.train_set),
            "environment": environment(), "last": self.history[-1] if self.history else None,
            "heldout": next((h for h in reversed(self.history) if "heldout_loss" in h), None),
            **self.provenance,
        })

    # -- training ---------------------------------------------------------------------------------

    def train(self, deadline: float, max_steps: int | None = None, watch=None) -> None:
        """Steps until ``deadline`` (or ``max_steps``); ``watch`` (``stages.StageWatch``) may stop
        it sooner and takes its periodic checkpoints."""
        cfg = self.cfg
        started, first = time.time(), self.step
        schedule = RunSchedule(deadline, first_step=first, warmup_steps=cfg.warmup_steps, decay_share=cfg.decay_share,
                               floor=cfg.min_lr / cfg.lr, max_steps=max_steps, rewarm_from=self.resumed_at,
                               ended_at=resumed_rate(self.history, cfg.lr))
        sums, steps, tokens, window = None, 0, 0, time.time()
        batches = self.train_set.epoch(cfg.batch_tokens, cfg.seed, self.epoch)
        while (time.time() < deadline and (max_steps is None or self.step - first < max_steps)
               and not (watch is not None and watch.stop)):
            if self.position >= len(batches):
                self.epoch, self.position = self.epoch + 1, 0
                batches = self.train_set.epoch(cfg.batch_tokens, cfg.seed, self.epoch)
            ids, length = batches[self.position]
            batch = self.train_set.batch(torch.from_numpy(ids).to(self.device), length, self._dropped(len(ids)))
            lr = cfg.lr * schedule.factor(self.step)
            for group in self.opt.param_groups:
                group["lr"] = lr
            align_weight = cfg.align_weight * ramp(self.step, cfg.align_start, cfg.align_ramp)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                loss, per_stream, acc, _ = self.forward(self.model, batch, self.allowed, self.stream_weights)
                if self.probe is None:
                    align = torch.zeros((), device=self.device)
                else:  # logged before it counts too (no gradient then)
                    with torch.set_grad_enabled(align_weight > 0):
                        align = self.probe.loss(batch["gold"])
            self.opt.zero_grad(set_to_none=True)
            (loss + align_weight * align if align_weight > 0 else loss).backward()
            grad = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.opt.step()
            self.step, self.position = self.step + 1, self.position + 1
            tokens += len(ids) * length
            part = torch.cat([loss.detach()[None], grad[None], per_stream, acc, align.detach()[None]])
            sums, steps = (part if sums is None else sums + part), steps + 1
            if self.step % cfg.log_every == 0:  # a resumed run's first window is shorter
                self._log_row(sums / steps, lr, tokens, time.time() - window)
                sums, steps, tokens, window = None, 0, 0, time.time()
            if self.step % cfg.eval_every == 0:
                self.history.append({"step": self.step, **self.evaluate()})
                self.log(f"lm: step {self.step} held out {self.history[-1]}")
            if watch is not None:
                watch.tick(self.step)
        elapsed = time.time() - started
        self.runs.append({"steps": [first, self.step], "seconds": round(elapsed, 1),
                          "steps_per_s": round((self.step - first) / max(elapsed, 1e-9), 3)})
        if not self.history or "heldout_loss" not in self.history[-1]:
            self.history.append({"step": self.step, **self.evaluate()})
        self.log(f"lm: stopped at step {self.step} (epoch {self.epoch}), held out {self.history[-1]}")

    def _dropped(self, rows: int) -> torch.Tensor | None:
        """Which of this step's ``rows`` train without their text (``text_dropout``): a pure
        function of (seed, step), so a resumed run draws what an unbroken one would."""
        if self.cfg.text_dropout <= 0:
            return None
        draw = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self.step)
        return (torch.rand(rows, generator=draw) < self.cfg.text_dropout).to(self.device)

    def _log_row(self, mean: torch.Tensor, lr: float, tokens: int, seconds: float) -> None:
        K = self.layout.K
        values = mean.tolist()
        row = {"step": self.step, "epoch": self.epoch, "loss": round(values[0], 4), "grad_norm": round(values[1], 3),
               "stream_loss": [round(v, 4) for v in values[2:2 + K]],
               "stream_acc": [round(v, 4) for v in values[2 + K:2 + 2 * K]], "lr": lr,
               "tokens_per_s": round(tokens / max(seconds, 1e-9))}
        if self.probe is not None:
            row["align_loss"] = round(values[2 + 2 * K], 4)
        self.history.append(row)
        self.log(f"lm: step {row['step']} epoch {row['epoch']} loss {row['loss']} acc0 {row['stream_acc'][0]} "
                 f"lr {lr:.2e} {row['tokens_per_s']} tok/s")

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Teacher-forced loss and accuracy of the held-out sentences (never trained on)."""
        self.model.eval()
        totals, n, align_sum, align_count = None, 0, 0.0, 0
        for ids, length in self.heldout.epoch(self.cfg.batch_tokens, 0, 0):
            batch = self.heldout.batch(torch.from_numpy(ids).to(self.device), length)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16):
                loss, per_stream, acc, count = stream_loss(self.model, batch, self.allowed, self.stream_weights)
                if self.probe is not None:
                    align_sum += float(self.probe.loss(batch["gold"])) * int((batch["gold"][..., 0] >= 0).sum())
                    align_count += int((batch["gold"][..., 0] >= 0).sum())
            part = torch.cat([per_stream * count, acc * count, count.float()])
            totals = part if totals is None else totals + part
            n += 1
        self.model.train()
        if totals is None:
            return {}
        K = self.layout.K
        count = totals[2 * K:].clamp(min=1)
        per_stream, acc = totals[:K] / count, totals[K:2 * K] / count
        weights = self.stream_weights
        out = {"heldout_loss": round(float((per_stream * weights).sum() / weights.sum()), 4),
               "heldout_stream_loss": [round(v, 4) for v in per_stream.tolist()],
               "heldout_stream_acc": [round(v, 4) for v in acc.tolist()]}
        if align_count:  # the probed heads' mean attention on the word each frame reads: exp(-loss)
            out["heldout_align_loss"] = round(align_sum / align_count, 4)
        return out
