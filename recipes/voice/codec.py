"""Training the codec: a ``transformers.DacModel`` (weight-normalized while it trains) on random
crops of the synthesized speech, with DAC's losses (multi-scale mel, waveform, VQ commitment and
codebook terms, least-squares GAN and feature matching against ``discriminators.py``), dead-code
re-seeding, a warmup-stable-decay schedule by the clock (``schedule.py``) and a wall-clock budget. The whole training set lives on the device
as int16 and crops are drawn there from a generator seeded by (seed, step): a resumed run draws
exactly what an uninterrupted one would have.
"""

from __future__ import annotations

import copy
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from recipes.voice.checkpoint import environment, load_state, read_record, save_state, write_record
from recipes.voice.config import CodecShape, CodecTrain, Recipe
from recipes.voice.data import Split, load_split
from recipes.voice.discriminators import Discriminators, discriminator_loss, generator_losses
from recipes.voice.losses import MultiScaleMelLoss, waveform_l1
from recipes.voice.schedule import RunSchedule, resumed_rate


def build_codec(shape: CodecShape, train: CodecTrain):
    """A fresh DacModel of ``shape`` with weight normalization (removed again by ``plain``)."""
    import transformers

    torch.manual_seed(train.seed)
    model = transformers.DacModel(shape.dac_config(quantizer_dropout=train.quantizer_dropout))
    # transformers draws every Embedding from N(0, 0.02), the codebooks too; DAC's reference
    # leaves nn.Embedding's N(0, 1). From codes 50x smaller than the encoder's latents soon are,
    # the commitment loss crushes the latents towards them, and the decoder, given nothing, sits
    # at the average spectrum (mel ~4.7: 1,400 and 3,900 steps on the H200). On the CPU probe
    # (plateau.py) both inits sit there ~750 steps; N(0, 1) leaves at ~800 and is at mel ~3.1 by
    # step 1,200, N(0, 0.02) still at ~4.9.
    with torch.no_grad():
        for quantizer in model.quantizer.quantizers:
            quantizer.codebook.weight.normal_(0.0, train.codebook_init_std)
    model.apply_weight_norm()
    return model


def plain(model):
    """The DacModel speechctl loads, from a training codec: weight normalization folded into
    plain weights, no quantizer dropout, eval mode, on the CPU. (A fresh model filled with the
    computed weights: removing the parametrizations from a deep copy would strip them from the
    original too, whose parametrized class the copy shares.)"""
    import transformers

    config = copy.deepcopy(model.config)
    config.quantizer_dropout = 0.0
    fresh = transformers.DacModel(config)
    state = {}
    with torch.no_grad():
        for name in fresh.state_dict():
            owner, _, attr = name.rpartition(".")
            state[name] = getattr(model.get_submodule(owner), attr).detach().float().cpu().clone()
    fresh.load_state_dict(state)
    return fresh.eval()


class Crops:
    """Random [B, L] crops of a split held on the device (int16), with a random gain."""

    def __init__(self, split: Split, device, length: int, seed: int):
        with warnings.catch_warnings():  # a read-only memmap: copied to the device, never written
            warnings.simplefilter("ignore", UserWarning)
            self.audio = torch.from_numpy(np.asarray(split.audio)).to(device)
        if self.audio.device.type == "cpu":
            self.audio = self.audio.clone()
        if self.audio.numel() <= length:
            raise ValueError(f"the training audio ({self.audio.numel()} samples) is shorter than a crop ({length})")
        self.device, self.length, self.seed = device, length, seed
        self.offsets = torch.arange(length, device=device)

    def batch(self, step: int, size: int) -> torch.Tensor:
        g = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, self.audio.numel() - self.length, (size, 1), generator=g, device=self.device)
        gain = 0.5 + 0.5 * torch.rand((size, 1), generator=g, device=self.device)
        return self.audio[starts + self.offsets].float() * (gain / 32768.0)


class CodecTrainer:
    def __init__(self, recipe: Recipe, data_dir: Path, device: str, data_sha256: str, log=print):
        self.recipe, self.log, self.device = recipe, log, torch.device(device)
        self.shape, self.cfg = recipe.codec, recipe.codec_train
        self.data_sha256 = data_sha256
        cfg = self.cfg
        if self.device.type == "cuda":
            # TF32 for the convolutions (nearly all of the work) but not for matmuls: the
            # quantizer's codebook lookup is one, and at TF32's 10-bit mantissa a stage whose
            # latents sit in a narrow cone saw one code where float32 sees hundreds (step 7,163:
            # codebook 5 used 1 code in training, 605 on the same audio in float32; emulated on
            # the CPU). The decoder then learned codes that inference never gives it.
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = True
            torch.backends.cudnn.benchmark = True
        self.model = build_codec(self.shape, cfg).to(self.device).train()
        if cfg.freeze_codes:
            self.model.encoder.requires_grad_(False)
            self.model.quantizer.requires_grad_(False)
        self.disc = Discriminators(cfg.disc_periods, cfg.disc_stft, cfg.disc_channels).to(self.device).train()
        fused = self.device.type == "cuda"
        self.opt_g = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=cfg.betas,
                                       weight_decay=cfg.weight_decay, fused=fused)
        self.opt_d = torch.optim.AdamW(self.disc.parameters(), lr=cfg.lr_disc, betas=cfg.betas,
                                       weight_decay=cfg.weight_decay, fused=fused)
        self.mel = MultiScaleMelLoss(self.shape.sampling_rate, cfg.mel_windows, cfg.mel_bins).to(self.device)
        hop = self.shape.hop_length
        self.segment = max(1, round(cfg.segment_s * self.shape.sampling_rate / hop)) * hop
        self.crops = Crops(load_split(data_dir, "train"), self.device, self.segment, cfg.seed)
        self.heldout = load_split(data_dir, "heldout")
        K, C = self.shape.n_codebooks, self.shape.codebook_size
        self.usage = torch.zeros(K, C, device=self.device)
        self.step, self.history, self.runs = 0, [], []
        self.encoder, self.decoder = self.model.encoder, self.model.decoder
        self.disc_forward = self.disc
        self.compiled = cfg.compile
        if cfg.compile:
            self.encoder, self.decoder = torch.compile(self.encoder), torch.compile(self.decoder)
            self.disc_forward = torch.compile(self.disc)

    # -- checkpoints ----------------------------------------------------------------------------

    def modules(self):
        return {"codec": self.model, "disc": self.disc}

    def optimizers(self):
        return {"codec": self.opt_g, "disc": self.opt_d}

    def resume(self, path: Path) -> None:
        record = read_record(path) or {}
        if record.get("data_sha256") and record["data_sha256"] != self.data_sha256:
            self.log(f"codec: WARNING: {path} was trained on other data ({record['data_sha256'][:16]})")
        meta = load_state(path, self.modules(), self.optimizers())
        self.step, self.history, self.runs = meta["step"], meta["history"], meta["runs"]
        self.usage.copy_(meta["usage"].to(self.device))
        self.log(f"codec: resumed at step {self.step} ({meta['resume']})")

    def save(self, path: Path) -> None:
        meta = {"step": self.step, "history": self.history, "runs": self.runs, "usage": self.usage.cpu()}
        resume = save_state(path, self.modules(), self.optimizers(), meta)
        codec_params = sum(p.numel() for p in plain(self.model).parameters())  # as shipped
        write_record(path, {
            "stage": "codec", "step": self.step, "resume": resume, "recipe": self.recipe.to_dict(),
            "data_sha256": self.data_sha256, "runs": self.runs, "environment": environment(),
            "codec_parameters": codec_params,
            "disc_parameters": sum(p.numel() for p in self.disc.parameters()),
            "last": self.history[-1] if self.history else None,
            "heldout": next((h for h in reversed(self.history) if "heldout_mel" in h), None),
        })

    # -- training -------------------------------------------------------------------------------

    def _autocast(self, disc: bool = False):
        enabled = self.cfg.bf16 or (disc and self.cfg.disc_bf16)
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def train(self, deadline: float, max_steps: int | None = None, watch=None) -> None:
        """Steps until ``deadline`` (or ``max_steps``); ``watch`` (``stages.StageWatch``) may stop
        it sooner and takes its periodic checkpoints."""
        cfg = self.cfg
        started, first_step = time.time(), self.step
        schedule = RunSchedule(deadline, first_step=first_step, warmup_steps=cfg.warmup_steps,
                               decay_share=cfg.decay_share, floor=cfg.min_lr_share, max_steps=max_steps,
                               ended_at=resumed_rate(self.history, cfg.lr))
        sums: dict[str, torch.Tensor] = {}  # since the last log line; counts: steps that gave each
        counts: dict[str, int] = {}
        window_start = time.time()
        while (time.time() < deadline and (max_steps is None or self.step - first_step < max_steps)
               and not (watch is not None and watch.stop)):
            scale = schedule.factor(self.step)
            for group in self.opt_g.param_groups:
                group["lr"] = cfg.lr * scale
            for group in self.opt_d.param_groups:
                group["lr"] = cfg.lr_disc * scale
            torch.manual_seed(cfg.seed * 7919 + self.step)  # quantizer dropout draws from the global generator
            losses = self.train_step(self.crops.batch(self.step, cfg.batch_size))
            for k, v in losses.items():
                sums[k], counts[k] = sums.get(k, 0.0) + v.detach(), counts.get(k, 0) + 1
            self.step += 1
            if self.step % cfg.log_every == 0:
                # a mean over the steps the window had: a resumed run's first window is shorter,
                # and the adversarial terms begin mid-window
                row = {k: round(float(v) / counts[k], 5) for k, v in sums.items()}
                row.update(step=self.step, lr=cfg.lr * scale, seconds=round(time.time() - window_start, 2),
                           usage=self._usage_summary())
                self.history.append(row)
                self.log("codec: " + " ".join(f"{k} {v}" for k, v in row.items() if k != "usage")
                         + f" used {row['usage']}")
                sums, counts, window_start = {}, {}, time.time()
            if cfg.codebook_reset_every and self.step % cfg.codebook_reset_every == 0:
                self._reset_dead_codes()
            if watch is not None:
                watch.tick(self.step)
        elapsed = time.time() - started
        self.runs.append({"steps": [first_step, self.step], "seconds": round(elapsed, 1),
                          "steps_per_s": round((self.step - first_step) / max(elapsed, 1e-9), 2),
                          "freeze_codes": cfg.freeze_codes})
        self.history.append({"step": self.step, **self.evaluate()})

    def train_step(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """One optimizer step of both models on the batch ``x`` [B, L] (``_step``); where the
        compiled modules fail (compiling happens at a call: the first step, the first adversarial
        step), the step again in eager mode and eager from then on,
        so that a device call is not lost to the compiler. (A failure comes before any optimizer
        step; only the code-usage counts of the failed forward may be counted twice.)"""
        try:
            return self._step(x)
        except Exception as e:  # noqa: BLE001 - any compiler failure; an eager failure re-raises below
            if not self.compiled:
                raise
            self.log(f"codec: torch.compile failed at step {self.step} ({type(e).__name__}: {str(e)[:200]}); eager from here")
            self.encoder, self.decoder, self.disc_forward = self.model.encoder, self.model.decoder, self.disc
            self.compiled = False
            self.opt_g.zero_grad(set_to_none=True)
            self.opt_d.zero_grad(set_to_none=True)
            return self._step(x)

    def _step(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        with self._autocast():
            with torch.set_grad_enabled(not cfg.freeze_codes):
                z = self.encoder(x[:, None])
                zq, codes, latents, commit, codebook = self.model.quantizer(z)
            y = self.decoder(zq)[:, 0, : x.shape[-1]].float()
        self._latents, self._codes = latents.detach(), codes.detach()
        K = codes.shape[1]
        self.usage.scatter_add_(1, codes.transpose(0, 1).reshape(K, -1),
                                torch.ones(1, device=x.device).expand(K, codes[:, 0].numel()))
        mel = self.mel(y, x)
        wave = waveform_l1(y, x)
        commit, codebook = commit.mean(), codebook.mean()  # frozen codes: reported, not trained on
        loss = cfg.w_mel * mel + cfg.w_wave * wave
        if not cfg.freeze_codes:
            loss = loss + cfg.w_commit * commit + cfg.w_codebook * codebook
        # the encoder's output RMS: latents crushed towards the codes show here first (plateau.py)
        out = {"mel": mel, "wave": wave, "commit": commit, "codebook": codebook,
               "latent_rms": z.detach().float().pow(2).mean().sqrt()}
        if cfg.adversarial and self.step >= cfg.disc_start_step:
            with self._autocast(disc=True):
                real = self.disc_forward(x)
                fake = self.disc_forward(y.detach())
                d_loss = discriminator_loss(real, fake)
            self.opt_d.zero_grad(set_to_none=True)
            d_loss.backward()
            torch.nn.utils.clip_grad_norm_(self.disc.parameters(), cfg.grad_clip)
            self.opt_d.step()
            with self._autocast(disc=True):
                fake = self.disc_forward(y)
                adv, feat = generator_losses([[f.detach() for f in r] for r in real], fake)
            loss = loss + cfg.w_adv * adv + cfg.w_feat * feat
            out.update(d=d_loss.detach(), adv=adv.detach(), feat=feat.detach())
        self.opt_g.zero_grad(set_to_none=True)
        loss.backward()
        out["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.opt_g.step()
        out["loss"] = loss.detach()
        return out

    def _usage_summary(self) -> list[float]:
        """Share of each codebook's codes used since the last reset."""
        return [round(x, 3) for x in (self.usage > 0).float().mean(dim=1).tolist()]

    @torch.no_grad()
    def _reset_dead_codes(self) -> None:
        """Codes unused since the last reset take the place of random latents of the last batch
        (each quantizer's own input projection), so that every code keeps being trained. Frozen
        codes are left as they are: only the usage counts start again."""
        if self.cfg.freeze_codes:
            self.usage.zero_()
            return
        D = self.shape.codebook_dim
        latents = self._latents.float()  # [B, K*D, T]
        for k, quantizer in enumerate(self.model.quantizer.quantizers):
            dead = torch.nonzero(self.usage[k] == 0).flatten()
            if dead.numel() == 0:
                continue
            pool = latents[:, k * D:(k + 1) * D].transpose(1, 2).reshape(-1, D)
            pick = torch.randint(0, pool.shape[0], (dead.numel(),), device=pool.device)
            quantizer.codebook.weight[dead] = pool[pick].to(quantizer.codebook.weight.dtype)
        self.usage.zero_()

    @torch.no_grad()
    def evaluate(self, limit: int = 64) -> dict:
        """Held-out reconstruction with all codebooks: mel loss and SNR (dB). cuDNN's autotuner
        stays off here: every utterance has its own length, and it would tune each convolution
        for each (training's crops have one shape). On the H200 this evaluation and the save
        after it took 82 s with the autotuner on, most of it, by all signs, tuning."""
        model = self.model.eval()
        hop = self.shape.hop_length
        mels, snrs = [], []
        benchmark, torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark, False
        for i in range(min(limit, len(self.heldout))):
            wave = torch.from_numpy(self.heldout.wave(i)).to(self.device)
            n = wave.numel() // hop * hop
            if n == 0:
                continue
            x = wave[None, :n]
            y = model(x[:, None]).audio_values[:, :n].float()
            mels.append(float(self.mel(y, x)))
            snrs.append(float(10 * torch.log10(x.pow(2).sum() / (x - y).pow(2).sum().clamp(min=1e-12))))
        torch.backends.cudnn.benchmark = benchmark
        model.train()
        return {"heldout_mel": round(float(np.mean(mels)), 5), "heldout_snr_db": round(float(np.mean(snrs)), 3)}


def load_trained_codec(path: Path, device: str = "cpu"):
    """The plain DacModel (eval, float32) of a codec checkpoint directory."""
    record = read_record(path)
    if record is None:
        raise FileNotFoundError(f"{path}: no recipe.json (not a codec checkpoint)")
    recipe = Recipe.from_dict(record["recipe"])
    model = build_codec(recipe.codec, recipe.codec_train)
    load_state(path, {"codec": model}, {})
    return plain(model).to(device), recipe, record


def describe_shape(shape: CodecShape) -> dict:
    return {**asdict(shape), "hop_length": shape.hop_length, "frame_rate": shape.frame_rate}


def save_codec_model(path: Path, out: Path, dtype: str = "float16") -> Path:
    """The codec of checkpoint ``path`` as the DacModel directory speechctl ships (``codec/``):
    weight normalization folded in, the encoder and decoder stored in ``dtype``, the quantizer in
    float32 (speechctl computes in float32). The LM trains on the codes of exactly this model.

    Why the quantizer keeps float32: its codebook lookup compares directions (cosine), and a
    stage's latents can sit in a cone narrower than float16's rounding of its weights (a large
    shared offset, small variations). Rounded, that stage's codes changed for 60% of the frames
    (step 7,163: codebook 5), while the quantizer is 2% of the codec's bytes."""
    model, _, _ = load_trained_codec(path)
    for part in (model.encoder, model.decoder):  # the quantizer stays as it is
        part.to(getattr(torch, dtype))
    model.config.dtype = dtype  # what most of the weights are (loaders ask for float32: codes.py)
    model.save_pretrained(out)
    return Path(out)
