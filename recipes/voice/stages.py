"""The recipe's stages as one-call units: each makes what it needs that is missing (the data, the
codes), trains until its deadline, saves, and packs what must travel into ``out`` (a device
call's $OUT: at most 8 files of at most 16 MiB).

    WORK/data-codec/  WORK/data/   synthesized speech (the codec's first hours; all of it)
    WORK/codec/                    codec training checkpoint    -> out/codec.tar.partNN
    WORK/codec-model/              the codec as shipped (fp16, float32 quantizer; made from it)
    WORK/codes/                    codes of WORK/data by WORK/codec-model
    WORK/lm/                       LM checkpoint                -> out/lm.tar.partNN
    WORK/model/                    the exported speechctl checkpoint -> out/model.tar.partNN

Carried back here, ``collect`` files the packs under ``.voice/`` (parts kept for carrying them
again, unpacked copies under ``.voice/unpacked/``) and makes ``codec-model`` from a codec.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from recipes.voice import checkpoint
from recipes.voice.config import ConfigError, Recipe, preset

# Of a stage's minutes, kept for what follows training: the held-out evaluation, saving, the
# plot and the pack. With cuDNN's autotuner off for the evaluation, all of that took 7 s on the
# H200 (thirteenth session: 471 s to the end of the evaluation, 472 s in all, of a 465 s training
# budget); with the autotuner on it had taken 82 s, past a reserve of 45 s, and the call was
# killed with nothing back. Checkpoints every CHECKPOINT_EVERY_S bound what a killed call loses.
RESERVE_S = 45
CHECKPOINT_EVERY_S = 120  # a checkpoint on the machine (and its pack in out) while training


class Log:
    """Lines to stdout and appended to a file (which travels in the checkpoint's pack)."""

    def __init__(self, path: Path | None = None):
        self.path = path

    def __call__(self, line: str) -> None:
        stamped = f"[{time.strftime('%H:%M:%S')}] {line}"
        print(stamped, flush=True)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(stamped + "\n")


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def apply_sets(recipe: Recipe, sets: list[str]) -> Recipe:
    """``section.field=value`` overrides (JSON values: 512, [0, 1, 2], true, "en-gb"; a list
    setting also takes its items between commas, ``data.natural=devil,wordnet``: no brackets or
    quotes for a shell to glob or strip)."""
    data = recipe.to_dict()
    for item in sets or []:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        if section not in data or not isinstance(data[section], dict) or name not in data[section]:
            raise ConfigError(f"--set {item}: no setting {key}")
        parsed = _json_or_text(value)
        if isinstance(data[section][name], list) and not isinstance(parsed, list):
            parsed = [_json_or_text(part) for part in value.split(",")]
        data[section][name] = parsed
    return Recipe.from_dict(data)


def _json_or_text(value: str):
    try:
        return json.loads(value)
    except ValueError:
        return value


def stage_started() -> float:
    """When the stage's device call began: ``VOICE_STARTED`` (gpu.sh's first line writes it; the
    call's time limit counts from there, and on a fresh machine Python and torch take a minute
    or more to start), else now."""
    value = os.environ.get("VOICE_STARTED")
    return float(value) if value else time.time()


def _deadline(started: float, minutes: float) -> float:
    return started + max(0.0, minutes * 60 - RESERVE_S)


class StageWatch:
    """What a stage's training loop answers to besides its deadline: SIGTERM (a time limit that
    came anyway: training ends at the next step, and what it learnt is saved and packed), and a
    checkpoint every ``every_s`` on the machine with its pack in ``out`` (a call killed outright
    still returns the last pack, and the next call on the machine resumes from there)."""

    def __init__(self, save, ckpt: Path, out: Path | None, name: str, every_s: float = CHECKPOINT_EVERY_S, log=print):
        self.save, self.ckpt, self.out, self.name, self.every_s, self.log = save, Path(ckpt), out, name, every_s, log
        self.stop = False
        self.last = time.time()
        self._previous = None

    def __enter__(self) -> "StageWatch":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_term)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def _on_term(self, signum, frame) -> None:
        self.log(f"{self.name}: SIGTERM: stopping at this step to save")
        self.stop = True

    def tick(self, step: int) -> None:
        """After training step ``step``: the periodic checkpoint, when due."""
        if time.time() - self.last < self.every_s:
            return
        started = time.time()
        self.save()
        if self.out is not None:
            checkpoint.pack(self.ckpt, self.out, self.name)
        self.last = time.time()
        self.log(f"{self.name}: checkpoint at step {step} ({self.last - started:.1f} s)")


def _unpack_into(carried: Path, name: str, dest: Path) -> Path:
    """A pack carried to the device (``carried/name.sha256`` + parts) unpacked as ``dest``, which
    appears whole or not at all (a stage running beside this one may look for it)."""
    if not (Path(carried) / f"{name}.sha256").is_file():
        raise FileNotFoundError(f"no {name}.sha256 in {carried}: carry the parts of '{name}' (see README)")
    dest = Path(dest)
    partial = dest.with_name(dest.name + ".unpacking")
    shutil.rmtree(partial, ignore_errors=True)
    checkpoint.unpack(carried, name, partial)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(partial, dest)
    return dest


# -- stages -------------------------------------------------------------------------------------


def _resume_into(carried: Path, name: str, ckpt: Path, unpack_into: Path | None = None,
                 missing: str | None = None) -> tuple[Path, str]:
    """Where a run takes checkpoint ``name`` from, and how to say it: this machine's own ``ckpt``
    when it has one (a call chained within the machine's warm time: newer than any pack, and a pack
    an earlier call carried stays on the machine between calls, older), else the pack carried in
    ``carried``, unpacked into ``unpack_into`` (default ``ckpt``); with neither, ``missing``."""
    if (ckpt / "state.pt").is_file():
        return ckpt, "this machine's own checkpoint"
    if (Path(carried) / f"{name}.sha256").is_file():
        return _unpack_into(carried, name, unpack_into or ckpt), f"the pack carried in {carried}"
    raise FileNotFoundError(missing or f"nothing to resume: no {name}.sha256 in {carried} and no {ckpt / 'state.pt'}")


def run_data(recipe: Recipe, work: Path, out: Path | None, log=print) -> dict:
    from recipes.voice import data

    manifest = data.ensure(recipe.data, Path(work) / "data", log=log)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "data-manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def run_codec(recipe: Recipe, work: Path, out: Path | None, minutes: float, resume: Path | None = None,
              device: str | None = None, max_steps: int | None = None, sets: list[str] | None = None) -> Path:
    """Train the codec for ``minutes`` (a new run from ``recipe``, or resumed from the pack in
    ``resume``); ``out`` receives codec.tar.partNN and codec.sha256 (codec-loss.png inside)."""
    from recipes.voice import data
    from recipes.voice.codec import CodecTrainer
    from recipes.voice.plots import plot_codec

    started = stage_started()
    work = Path(work)
    ckpt = work / "codec"
    if resume is not None:
        _, source = _resume_into(resume, "codec", ckpt)
        recipe = apply_sets(Recipe.from_dict(checkpoint.read_record(ckpt)["recipe"]), sets)
    else:
        shutil.rmtree(ckpt, ignore_errors=True)
    log = Log(ckpt / "log.txt")
    device = device or default_device()
    log(f"codec: {f'resuming ({source})' if resume else 'new run'} on {device}, {minutes} min "
        f"(the stage's clock began {time.time() - started:.0f} s ago)")
    expected = (checkpoint.read_record(ckpt) or {}).get("data_sha256") if resume else None
    manifest = data.ensure(recipe.data, work / "data-codec", expect_sha256=expected,
                           limit_hours=recipe.codec_train.data_hours, log=log)
    trainer = CodecTrainer(recipe, work / "data-codec", device, manifest["sha256"], log=log)
    if resume is not None:
        trainer.resume(ckpt)
    _train_save_pack(trainer, ckpt, out, "codec", _deadline(started, minutes), max_steps, started, log,
                     lambda png: plot_codec(trainer.history, png, f"codec ({recipe.scale}), step {trainer.step}"))
    return ckpt


def run_codec_speed(recipe: Recipe, work: Path, out: Path | None, batch_sizes: list[int],
                    device: str | None = None, steps: int = 10) -> list[dict]:
    """The codec's training step timed per batch size (``codec_speed.py``), on the codec's
    training data (made here where the machine has none yet); ``out`` receives codec-speed.json,
    to which a later run of the same call adds its rows."""
    from recipes.voice import data
    from recipes.voice.codec_speed import measure_codec_steps

    log = Log(Path(work) / "codec-speed.log")
    data.ensure(recipe.data, Path(work) / "data-codec", limit_hours=recipe.codec_train.data_hours, log=log)
    rows = measure_codec_steps(recipe, Path(work) / "data-codec", device or default_device(), batch_sizes,
                               steps=steps, log=log)
    if out is not None:  # one file for the runs of a call (each its own settings: VOICE_SET)
        path = Path(out) / "codec-speed.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        runs = json.loads(path.read_text())["runs"] if path.is_file() else []
        settings = recipe.to_dict()
        runs.append({"codec_train": settings["codec_train"], "codec": settings["codec"], "rows": rows})
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"runs": runs}, indent=2))
        tmp.replace(path)
    return rows


def _train_save_pack(trainer, ckpt: Path, out: Path | None, name: str, deadline: float, max_steps: int | None,
                     started: float, log, plot) -> None:
    """A stage's training (under a ``StageWatch``) and what follows it: the checkpoint, its loss
    plot (``plot(path)``) and the pack of both in ``out``."""
    with StageWatch(lambda: trainer.save(ckpt), ckpt, out, name, log=log) as watch:
        trainer.train(deadline, max_steps=max_steps, watch=watch)
    trained = time.time()
    trainer.save(ckpt)
    png = ckpt / f"{name}-loss.png"
    plot(png)
    log(f"{name}: saved step {trainer.step} in {ckpt}; {time.time() - started:.0f} s in all "
        f"({trained - started:.0f} s to the end of training)")
    if out is not None:  # the plot travels inside the pack (a call brings back at most 8 files)
        checkpoint.pack(ckpt, out, name)


def make_codec_model(codec_ckpt: Path, dest: Path) -> Path:
    """The shipped form of a codec checkpoint (DacModel, fp16 with a float32 quantizer) plus the codec's recipe.json."""
    from recipes.voice.codec import save_codec_model

    shutil.rmtree(dest, ignore_errors=True)
    save_codec_model(codec_ckpt, dest)
    shutil.copy(Path(codec_ckpt) / "recipe.json", Path(dest) / "recipe.json")
    return Path(dest)


def run_lm(recipe: Recipe, work: Path, out: Path | None, minutes: float, codec_model: Path,
           resume: Path | None = None, device: str | None = None, max_steps: int | None = None,
           sets: list[str] | None = None) -> Path:
    """Train the LM for ``minutes`` on the codes of ``codec_model`` (a directory, or a folder
    holding its pack); a new run takes the data and codec settings from the codec's record and
    the LM settings from ``recipe``. ``out`` receives lm.tar.partNN and lm.sha256 (lm-loss.png inside)."""
    from recipes.voice import codes
    from recipes.voice.lm import LMTrainer
    from recipes.voice.plots import plot_lm

    started = stage_started()
    work = Path(work)
    codec_model = Path(codec_model)
    if (codec_model / "codec-model.sha256").is_file():
        codec_model = _unpack_into(codec_model, "codec-model", work / "codec-model")
    ckpt = work / "lm"
    if resume is not None:
        _, source = _resume_into(resume, "lm", ckpt)
        recipe = apply_sets(Recipe.from_dict(checkpoint.read_record(ckpt)["recipe"]), sets)
    else:
        shutil.rmtree(ckpt, ignore_errors=True)
        # The voice (espeak-ng's voice, rate and pitch, the sample rate, the silences kept) is the
        # codec's; the text it reads (how many hours, which sources, the made-up sentences' seed)
        # is the LM's own (the held-out sentences depend on none of it).
        codec_recipe = Recipe.from_dict(checkpoint.read_record(codec_model)["recipe"])
        recipe = replace(recipe, data=recipe.data.voiced_as(codec_recipe.data), codec=codec_recipe.codec,
                         codec_train=codec_recipe.codec_train).validate()
    log = Log(ckpt / "log.txt")
    device = device or default_device()
    log(f"lm: {f'resuming ({source})' if resume else 'new run'} on {device}, {minutes} min "
        f"(the stage's clock began {time.time() - started:.0f} s ago)")
    manifest, code_manifest = codes.ensure_with_data(codec_model, recipe.data, work / "data", work / "codes", device, log=log)
    codes_sha = code_manifest["splits"]["train"]["codes_sha256"]
    trainer = LMTrainer(recipe, work / "codes", work, device, codes_sha, log=log,
                        provenance={"codec_sha256": code_manifest["codec_sha256"], "data_sha256": manifest["sha256"],
                                    "codes_identity": code_manifest["codes_identity"]})
    log(f"lm: {trainer.parameters_count() / 1e6:.2f} M parameters, {len(trainer.train_set)} utterances")
    if resume is not None:
        trainer.resume(ckpt)
    _train_save_pack(trainer, ckpt, out, "lm", _deadline(started, minutes), max_steps, started, log,
                     lambda png: plot_lm(trainer.history, png, trainer.layout.K,
                                         f"speech LM ({recipe.scale}), step {trainer.step}"))
    return ckpt


def _codec_for_lm(carried: Path, work: Path) -> Path:
    """The codec checkpoint an LM stage takes its codes from when no shipped codec was carried
    (``_resume_into``'s rule): this machine's codec (a chained `codec resume` then `lm`, or a codec
    stage training beside it with its codes frozen, whose every checkpoint gives the same codes),
    else the carried codec pack, unpacked into a directory of the LM's own (a codec stage beside
    it unpacks the same pack into ``WORK/codec``, whole or not at all)."""
    path, _ = _resume_into(carried, "codec", Path(work) / "codec", unpack_into=Path(work) / "lm-codec",
                           missing="no codec for the LM: carry .voice/codec-model or .voice/codec (or train one here first)")
    return path


def run_export(lm: Path, codec_model: Path, dest: Path, out: Path | None = None, sampling: dict | None = None,
               max_piece_chars: int | None = None, kept: str | None = None, log=print) -> Path:
    """``export`` checked against the codes the LM learnt (``sampling``, ``max_piece_chars``,
    ``kept``: ``export``'s, None its defaults)."""
    from recipes.voice.codes import codes_identity
    from recipes.voice.export import export, sizes

    # The codes an LM learnt are fixed by its codec's encoder and quantizer: a codec whose decoder
    # trained on after them (codes frozen) is still its codec.
    want, have = (checkpoint.read_record(lm) or {}).get("codes_identity"), codes_identity(codec_model)
    if want and want != have:
        raise RuntimeError(f"{codec_model} does not give the codes {lm} was trained on "
                           f"(encoder and quantizer sha256 {have[:16]} vs {want[:16]})")
    path = export(lm, codec_model, dest, sampling, max_piece_chars, kept)
    info = sizes(path)
    log(json.dumps(info, indent=2))
    if out is not None:
        checkpoint.pack(path, out, "model")
    return path


def collect(files: Path, root: Path = Path(".voice")) -> list[str]:
    """File the packs of a device call (``files``: its files_at folder) under ``root``: parts
    into ``root/NAME/`` (carry that folder to resume), unpacked into ``root/unpacked/NAME/``;
    a codec also gives ``root/unpacked/codec-model`` and its pack ``root/codec-model/``."""
    files, root = Path(files), Path(root)
    names = checkpoint.find_packed(files)
    for name in names:
        carry = root / name
        shutil.rmtree(carry, ignore_errors=True)
        carry.mkdir(parents=True)
        for f in checkpoint.pack_files(files, name):
            _copy(f, carry / f.name)
        unpacked = root / "unpacked" / name
        shutil.rmtree(unpacked, ignore_errors=True)
        checkpoint.unpack(carry, name, unpacked)
        print(f"{name}: parts in {carry}, unpacked in {unpacked}")
        for png in unpacked.glob("*.png"):
            _copy(png, root / png.name)
        if name == "codec":
            model = make_codec_model(unpacked, root / "unpacked" / "codec-model")
            shutil.rmtree(root / "codec-model", ignore_errors=True)
            checkpoint.pack(model, root / "codec-model", "codec-model")
            print(f"codec-model: {model}, pack in {root / 'codec-model'}")
    return names


def _copy(src: Path, dst: Path) -> None:
    """Contents only: what a device call brings back is read-only, its copies need not be."""
    dst.unlink(missing_ok=True)
    shutil.copyfile(src, dst)


def resolve_recipe(scale: str, sets: list[str] | None) -> Recipe:
    return apply_sets(preset(scale), sets or [])


def main_stage(args) -> None:
    """``python -m recipes.voice stage STAGE`` (what gpu.sh runs)."""
    work, out = Path(args.work), Path(args.out) if args.out else None
    recipe = resolve_recipe(args.scale, args.set)
    carried = Path(args.carried)
    if args.stage == "data":
        run_data(recipe, work, out, log=Log(work / "data.log"))
    elif args.stage == "codec":
        run_codec(recipe, work, out, args.minutes, resume=carried / "codec" if args.resume else None,
                  max_steps=args.max_steps, sets=args.set)
    elif args.stage == "codes":
        from recipes.voice import codes, data

        codec_model = _unpack_into(carried / "codec-model", "codec-model", work / "codec-model")
        codec_recipe = Recipe.from_dict(checkpoint.read_record(codec_model)["recipe"])
        manifest = data.ensure(codec_recipe.data, work / "data", log=Log(work / "data.log"))
        m = codes.ensure(codec_model, work / "data", work / "codes", default_device(), manifest["sha256"])
        if out is not None:
            (out / "codes-manifest.json").write_text(json.dumps(m, indent=2))
    elif args.stage == "lm":
        codec_model = carried / "codec-model"
        if not (codec_model / "codec-model.sha256").is_file():
            codec_model = make_codec_model(_codec_for_lm(carried, work), work / "codec-model")
        run_lm(recipe, work, out, args.minutes, codec_model,
               resume=carried / "lm" if args.resume else None, max_steps=args.max_steps, sets=args.set)
    elif args.stage == "export":
        codec_model = work / "codec-model"
        if not (codec_model / "model.safetensors").is_file():
            codec_model = _unpack_into(carried / "codec-model", "codec-model", codec_model)
        lm = work / "lm"
        if not (lm / "state.pt").is_file():
            lm = _unpack_into(carried / "lm", "lm", lm)
        run_export(lm, codec_model, work / "model", out)
    elif args.stage == "codec-speed":
        run_codec_speed(recipe, work, out, [int(b) for b in args.batches.split(",")])
    else:
        sys.exit(f"unknown stage {args.stage}")
