"""python -m recipes.voice COMMAND ...  (see README.md beside this file)"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def sampling_row(item: str) -> tuple:
    """``TEMPERATURE:TOP_K[:CFG]`` -> (temperature, top_k[, cfg scale]); a bad one exits with a
    line naming it."""
    parts = item.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        return (float(parts[0]), int(parts[1]), *(float(c) for c in parts[2:]))
    except ValueError:
        raise SystemExit(f"--sampling {item!r}: expected TEMPERATURE:TOP_K or TEMPERATURE:TOP_K:CFG, e.g. 0.6:20:2")


def repetition_row(item: str) -> tuple[int, int] | None:
    """``WINDOW:MAX_REPEAT`` -> (window, max_repeat); ``off`` -> (0, 0); ``voice`` -> None (the
    voice's own); a bad one exits with a line naming it."""
    if item in ("off", "voice"):
        return (0, 0) if item == "off" else None
    try:
        window, repeat = (int(v) for v in item.split(":"))
        if window < 1 or repeat < 1:
            raise ValueError
    except ValueError:
        raise SystemExit(f"--repetition {item!r}: expected WINDOW:MAX_REPEAT (positive), off or voice, e.g. 7:2")
    return window, repeat


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m recipes.voice", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def scale_args(q):
        q.add_argument("--scale", default="full", choices=["full", "tiny"])
        q.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                       help="override a setting, e.g. lm.num_layers=6 (JSON values)")

    q = sub.add_parser("stage", help="one GPU-call stage (what gpu.sh runs)")
    q.add_argument("stage", choices=["data", "codec", "codes", "lm", "export", "codec-speed"])
    scale_args(q)
    q.add_argument("--work", default="/root/voice", help="where the stage keeps data and checkpoints")
    q.add_argument("--out", default=None, help="where the files that travel back go ($OUT)")
    q.add_argument("--carried", default=".voice", help="where the carried packs are (codec/, codec-model/, lm/)")
    q.add_argument("--minutes", type=float, default=9.0, help="wall-clock budget of the whole stage")
    q.add_argument("--resume", action="store_true", help="continue from the carried checkpoint")
    q.add_argument("--max-steps", type=int, default=None)
    q.add_argument("--batches", default="32,64,128,256", help="codec-speed: the batch sizes to time")

    q = sub.add_parser("collect", help="file a device call's packs under .voice/ (and unpack them)")
    q.add_argument("files", help="the call's files_at folder")
    q.add_argument("--root", default=".voice")

    q = sub.add_parser("keep", help="commit .voice/NAME packs into this repository's history, out of its tree "
                                    "(a merge whose second parent holds them); restore brings them back")
    q.add_argument("names", nargs="+", help="packs under --root to keep, e.g. codec lm")
    q.add_argument("--root", default=".voice")
    q.add_argument("--note", default="", help="said in the commit's subject, e.g. 'codec step 8,300'")

    q = sub.add_parser("restore", help="file the newest kept pack of each name under .voice/ (as collect does)")
    q.add_argument("--root", default=".voice")
    q.add_argument("--commit", default=None, help="a keep merge other than the newest")

    q = sub.add_parser("export", help="the speechctl checkpoint directory from an LM and its codec")
    q.add_argument("--lm", default=".voice/unpacked/lm")
    q.add_argument("--codec-model", default=".voice/unpacked/codec-model")
    q.add_argument("--out", default=".voice/model")
    q.add_argument("--temperature", type=float, default=None, help="the voice's default sampling temperature")
    q.add_argument("--top-k", type=int, default=None, help="the voice's default top-k")
    q.add_argument("--max-piece-chars", type=int, default=None,
                   help="the longest piece of text the voice speaks in one request (default: export.MAX_PIECE_CHARS)")

    q = sub.add_parser("voice-prompt", help="recipes/voice/voice_prompt.json: the speech the voice follows on from, "
                                            "espeak-ng's through the voice's codec (voice_prompt.py)")
    q.add_argument("--codec", default="speechctl/voices/default/codec")
    q.add_argument("--out", default=None, help="default: recipes/voice/voice_prompt.json")

    q = sub.add_parser("ship", help="install an exported voice as speechctl's default (speechctl/voices/default/)")
    q.add_argument("model", nargs="?", default=".voice/model")

    q = sub.add_parser("ship-kept", help="make install's step: the newest kept LM and codec (this history), exported "
                                         "and shipped as speechctl's default voice; nothing where it is already")

    q = sub.add_parser("plot", help="loss curves of a checkpoint as PNG")
    q.add_argument("ckpt")
    q.add_argument("--out", required=True)

    q = sub.add_parser("pack", help="split a directory into NAME.tar.partNN (< 16 MiB) + NAME.sha256")
    q.add_argument("src")
    q.add_argument("--name", required=True)
    q.add_argument("--out", required=True)

    q = sub.add_parser("unpack", help="join NAME.tar.partNN (checked) and extract")
    q.add_argument("src")
    q.add_argument("--name", required=True)
    q.add_argument("--dest", required=True)

    q = sub.add_parser("speed", help="CPU speed of a shape through speechctl's vLLM engine (random weights)")
    scale_args(q)
    q.add_argument("--frames", type=int, default=100)
    q.add_argument("--repeats", type=int, default=5)
    q.add_argument("--cli", action="store_true", help="also time `speechctl tts` cold starts")
    q.add_argument("--out", default=None, help="append the JSON result to this file")

    q = sub.add_parser("eval-codec", help="held-out audio through a codec: wavs, SNR, Whisper WER")
    q.add_argument("--codec-model", default=".voice/unpacked/codec-model")
    q.add_argument("--data", default=".voice/heldout-data",
                   help="a data directory; made (the held-out sentences only) when it has none")
    q.add_argument("--out", required=True)
    q.add_argument("--limit", type=int, default=None)
    q.add_argument("--asr", default="whisper-tiny.en", help="speechctl ASR model for the WER ('' to skip)")

    q = sub.add_parser("codebooks", help="what each codebook of a codec checkpoint carries on held-out audio "
                                         "(float32 and TF32 lookups, how narrow each stage's latents are)")
    q.add_argument("--codec", default=".voice/unpacked/codec", help="a codec checkpoint (the training form)")
    q.add_argument("--data", default=".voice/heldout-data")
    q.add_argument("--limit", type=int, default=40)

    q = sub.add_parser("plateau", help="the codec's early plateau probed on this CPU (latents, mel loss; plateau.py)")
    q.add_argument("--codebook-init-std", type=float, default=1.0)
    q.add_argument("--steps", type=int, default=1200)
    q.add_argument("--work", default=".voice/plateau", help="where its 0.3 h of speech is made")

    q = sub.add_parser("eval-voice", help="issue 20's round-trip table: espeak-ng, its codec reconstruction and "
                                          "the exported voice through speechctl, Whisper's WER on each")
    q.add_argument("--model", default=".voice/model", help="an exported voice (python -m recipes.voice export)")
    q.add_argument("--data", default=".voice/heldout-data",
                   help="a data directory; made (the held-out sentences only) when it has none")
    q.add_argument("--out", required=True)
    q.add_argument("--limit", type=int, default=40)
    q.add_argument("--sampling", action="append", default=None, metavar="TEMPERATURE:TOP_K[:CFG]",
                   help="a row of the voice per setting, CFG its classifier-free guidance scale (default 1: "
                        "off; the LM must have trained with lm_train.text_dropout) (repeatable; default 0.8:50)")
    q.add_argument("--repetition", action="append", default=None, metavar="WINDOW:MAX_REPEAT",
                   help="repetition-aware sampling (off, voice: the voice's own); each sampling row is run with "
                        "each (repeatable; default voice)")
    q.add_argument("--first", type=int, default=0,
                   help="the first held-out sentence read: report on 0 (the first --limit), choose settings from 40 on")
    q.add_argument("--seed", type=int, default=1234)
    q.add_argument("--asr", default="whisper-tiny.en")
    q.add_argument("--dtype", default=None, help="the voice's engine's dtype (default: the checkpoint's)")

    q = sub.add_parser("lm-attention", help="does the LM read along? each head's attention on the word each "
                                            "held-out frame reads (align.py), against attention spread evenly")
    q.add_argument("--lm", default=".voice/unpacked/lm", help="an LM checkpoint (the training form)")
    q.add_argument("--codec-model", default=".voice/unpacked/codec-model")
    q.add_argument("--data", default=".voice/heldout-data", help="made (the held-out sentences only) where absent")
    q.add_argument("--codes", default=".voice/heldout-codes", help="made with --codec-model where absent")

    q = sub.add_parser("compare-reading", help="letters or phonemes: the same small LM trained twice from scratch "
                                               "on the same codes, reading each (compare_reading.py)")
    q.add_argument("--codec-model", default=".voice/unpacked/codec-model")
    q.add_argument("--work", default=".voice/compare-reading", help="its data, codes and two LMs")
    q.add_argument("--out", default="docs/voice")
    q.add_argument("--hours", type=float, default=1.0)
    q.add_argument("--steps", type=int, default=400)
    q.add_argument("--batch-tokens", type=int, default=4096)
    q.add_argument("--threads", type=int, default=2)
    q.add_argument("--set", action="append", default=[], help="section.field=value, both runs (repeatable)")

    q = sub.add_parser("dryrun", help="the whole recipe at tiny scale on this CPU (minutes)")
    q.add_argument("--work", default=".voice/dryrun")
    q.add_argument("--codec-steps", type=int, default=60)
    q.add_argument("--lm-steps", type=int, default=300)

    q = sub.add_parser("trim-espeak", help="the carried espeak-ng bundle with English alone (espeak_bundle.py), checked")
    q.add_argument("bundle", type=Path, nargs="?", default=Path(".gpu/espeak"))
    q.add_argument("--sentences", type=int, default=300, help="of the corpus, spoken with both data directories")
    sub.add_parser("text-sources", help="rebuild text/devil.txt, words.txt and wordnet.txt from Debian's packages")

    args = p.parse_args(argv)
    if args.command == "stage":
        from recipes.voice.stages import main_stage

        main_stage(args)
    elif args.command == "collect":
        from recipes.voice.stages import collect

        collect(Path(args.files), Path(args.root))
    elif args.command == "keep":
        from recipes.voice.keep import keep

        print(keep(args.names, Path(args.root), note=args.note))
    elif args.command == "restore":
        from recipes.voice.keep import restore

        restore(Path(args.root), commit=args.commit)
    elif args.command == "export":
        from recipes.voice.stages import run_export

        from recipes.voice.export import SAMPLING

        sampling = {**SAMPLING, **({"temperature": args.temperature} if args.temperature is not None else {}),
                    **({"top_k": args.top_k} if args.top_k is not None else {})}
        run_export(Path(args.lm), Path(args.codec_model), Path(args.out), sampling=sampling,
                   max_piece_chars=args.max_piece_chars)
    elif args.command == "ship":
        from recipes.voice.export import ship, sizes

        dest = ship(Path(args.model))
        print(f"{dest}: {sizes(dest)['total_bytes'] / 1e6:.1f} MB")
    elif args.command == "voice-prompt":
        from recipes.voice.voice_prompt import PROMPT_FILE, make_voice_prompt, write_voice_prompt

        entry = make_voice_prompt(Path(args.codec))
        out = write_voice_prompt(entry, Path(args.out) if args.out else PROMPT_FILE)
        print(f"{out}: {len(entry['codes'][0])} frames of {entry['text']!r}, the last {entry['lead_frames']} a pause")
    elif args.command == "ship-kept":
        from recipes.voice.keep import ship_kept

        ship_kept()
    elif args.command == "plot":
        from recipes.voice.checkpoint import read_record
        from recipes.voice.plots import plot_codec, plot_lm
        import torch

        meta = torch.load(Path(args.ckpt) / "state.pt", map_location="cpu", weights_only=False)["meta"]
        record = read_record(Path(args.ckpt))
        if record["stage"] == "codec":
            plot_codec(meta["history"], Path(args.out))
        else:
            plot_lm(meta["history"], Path(args.out), record["recipe"]["codec"]["n_codebooks"])
    elif args.command == "pack":
        from recipes.voice.checkpoint import pack

        for part in pack(Path(args.src), Path(args.out), args.name):
            print(part)
    elif args.command == "unpack":
        from recipes.voice.checkpoint import unpack

        print(unpack(Path(args.src), args.name, Path(args.dest)))
    elif args.command == "speed":
        from recipes.voice.speed import measure
        from recipes.voice.stages import resolve_recipe

        recipe = resolve_recipe(args.scale, args.set)
        result = measure(recipe.lm, recipe.codec, frames=args.frames, repeats=args.repeats, cli=args.cli)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(result) + "\n")
    elif args.command == "eval-codec":
        from recipes.voice.evaluate import eval_codec

        eval_codec(Path(args.codec_model), Path(args.data), Path(args.out), args.limit, args.asr or None)
    elif args.command == "codebooks":
        from recipes.voice.codebooks import main as codebooks

        codebooks(Path(args.codec), Path(args.data), args.limit)
    elif args.command == "plateau":
        from recipes.voice.plateau import probe

        probe(Path(args.work), args.codebook_init_std, args.steps)
    elif args.command == "eval-voice":
        import shlex

        from recipes.voice.evaluate import eval_voice

        samplings = [sampling_row(item) for item in args.sampling or ["0.8:50"]]
        repetitions = [repetition_row(item) for item in args.repetition or ["voice"]]
        command = shlex.join(["python", "-m", "recipes.voice", *(sys.argv[1:] if argv is None else argv)])
        eval_voice(Path(args.model), Path(args.data), Path(args.out), args.limit, samplings, args.seed, args.asr,
                   command=command, first=args.first, repetitions=repetitions, dtype=args.dtype)
    elif args.command == "lm-attention":
        import numpy as np

        from recipes.voice import codes, data
        from recipes.voice.align import attention_table
        from recipes.voice.checkpoint import read_record
        from recipes.voice.config import Recipe
        from recipes.voice.lm import LMTrainer

        recipe = Recipe.from_dict(read_record(Path(args.lm))["recipe"])
        manifest = data.ensure(recipe.data, Path(args.data), limit_hours=0)
        codes.ensure(Path(args.codec_model), Path(args.data), Path(args.codes), "cpu", manifest["sha256"])
        recipe.lm_train.bf16 = False
        trainer = LMTrainer(recipe, Path(args.codes), Path(args.codes) / "work", "cpu", "-", log=lambda line: None)
        trainer.resume(Path(args.lm))
        table, uniform = attention_table(trainer)
        print(f"{args.lm} (step {trainer.step}): attention on the word each held-out frame reads, layer x head "
              f"(spread evenly: {uniform:.3f})")
        print(np.array2string(table, precision=3, suppress_small=True))
    elif args.command == "compare-reading":
        import shlex

        from recipes.voice.compare_reading import compare

        command = shlex.join(["python", "-m", "recipes.voice", *(sys.argv[1:] if argv is None else argv)])
        compare(Path(args.codec_model), Path(args.work), Path(args.out), args.hours, args.steps, args.batch_tokens,
                args.threads, command=command, sets=args.set)
    elif args.command == "dryrun":
        from recipes.voice.dryrun import dryrun

        dryrun(Path(args.work), args.codec_steps, args.lm_steps)
    elif args.command == "trim-espeak":
        from recipes.voice import espeak_bundle
        from recipes.voice.config import DataConfig
        from recipes.voice.text import make_corpus

        before, after = espeak_bundle.trim(args.bundle)
        corpus = make_corpus(DataConfig())
        # spread over the corpus: its source sentences first, then the ones made up from the word list
        every = max(1, (len(corpus.train) + len(corpus.heldout)) // args.sentences)
        sentences = (corpus.heldout + corpus.train)[::every][: args.sentences]
        espeak_bundle.check(args.bundle, sentences)
        print(f"{args.bundle}: espeak-ng-data {before / 1e6:.2f} -> {after / 1e6:.2f} MB; "
              f"{len(sentences)} sentences of the corpus spoken byte for byte as with the full data")
    elif args.command == "text-sources":
        from recipes.voice.text_sources import build_sources

        print(json.dumps(build_sources(), indent=2))
    else:  # pragma: no cover
        sys.exit(f"unknown command {args.command}")


if __name__ == "__main__":
    main()
