"""Reference word timestamps from OpenAI's own whisper package, for tests/test_asr_timestamps.py.

openai-whisper is not a speechctl dependency: install it into a throwaway directory, run this
once, commit the JSON it writes (the command that made it is recorded inside):

    pip install --target /tmp/owhisper --no-deps openai-whisper==20250625 more-itertools
    PYTHONPATH=/tmp/owhisper:. python benchmarks/asr_openai_reference.py tests/test_asr_openai_words.json

It loads the converted tiny.en checkpoint (speechctl's built-in, a Hugging Face checkpoint) into
``whisper.model.Whisper`` (names mapped below, alignment heads from its generation config) and
runs ``whisper.transcribe(..., word_timestamps=True)`` on every clip of ``samples/asr`` and on
each window of the 24 clips back to back (0.3 s apart), greedy and with beam 5 (temperature 0,
no fallback, no context), in float32 on the CPU.

On what speechctl's model hears: each window's audible part (``plan_windows``), as
transformers' log-mel features. OpenAI's ``transcribe`` would pad the log-mel of a short input
with zeros (``pad_or_trim``) where transformers pads the audio with silence, and decode other
tokens on most of these clips; here its ``pad_or_trim`` hands it transformers' features of the
window instead, so that the decoding and the word timing are OpenAI's code on the same input.
"""

import json
import re
import sys
from pathlib import Path

import numpy as np
import torch

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "asr"


def openai_state_dict(hf: dict) -> dict:
    """transformers' WhisperForConditionalGeneration names -> OpenAI's."""
    rules = [
        (r"^model\.encoder\.embed_positions\.weight$", "encoder.positional_embedding"),
        (r"^model\.decoder\.embed_positions\.weight$", "decoder.positional_embedding"),
        (r"^model\.decoder\.embed_tokens\.weight$", "decoder.token_embedding.weight"),
        (r"^model\.encoder\.layer_norm\.", "encoder.ln_post."),
        (r"^model\.decoder\.layer_norm\.", "decoder.ln."),
        (r"^model\.(encoder|decoder)\.layers\.(\d+)\.", r"\1.blocks.\2."),
        (r"^model\.encoder\.conv", "encoder.conv"),
        (r"\.self_attn_layer_norm\.", ".attn_ln."),
        (r"\.encoder_attn_layer_norm\.", ".cross_attn_ln."),
        (r"\.final_layer_norm\.", ".mlp_ln."),
        (r"\.self_attn\.", ".attn."),
        (r"\.encoder_attn\.", ".cross_attn."),
        (r"\.q_proj\.", ".query."),
        (r"\.k_proj\.", ".key."),
        (r"\.v_proj\.", ".value."),
        (r"\.out_proj\.", ".out."),
        (r"\.fc1\.", ".mlp.0."),
        (r"\.fc2\.", ".mlp.2."),
    ]
    out = {}
    for name, value in hf.items():
        if name == "proj_out.weight":
            continue
        for pattern, repl in rules:
            name = re.sub(pattern, repl, name)
        out[name] = value
    return out


def main(out_path: str) -> None:
    import whisper
    from safetensors.torch import load_file
    from transformers import WhisperFeatureExtractor
    from whisper.model import ModelDimensions, Whisper

    from speechctl.asr.segments import plan_windows

    from speechctl.asr.checkpoint import ensure_whisper
    from speechctl.audio import read_audio

    ckpt = ensure_whisper()
    config = json.loads((ckpt / "config.json").read_text())
    generation = json.loads((ckpt / "generation_config.json").read_text())
    dims = ModelDimensions(
        n_mels=config["num_mel_bins"], n_audio_ctx=config["max_source_positions"], n_audio_state=config["d_model"],
        n_audio_head=config["encoder_attention_heads"], n_audio_layer=config["encoder_layers"], n_vocab=config["vocab_size"],
        n_text_ctx=config["max_target_positions"], n_text_state=config["d_model"], n_text_head=config["decoder_attention_heads"],
        n_text_layer=config["decoder_layers"],
    )
    model = Whisper(dims)
    state = {k: v.float() for k, v in openai_state_dict(load_file(str(ckpt / "model.safetensors"))).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"alignment_heads"}, (missing, unexpected)
    heads = torch.zeros(dims.n_text_layer, dims.n_text_head, dtype=torch.bool)
    for layer, head in generation["alignment_heads"]:
        heads[layer, head] = True
    model.register_buffer("alignment_heads", heads.to_sparse(), persistent=False)
    model.eval()

    features = WhisperFeatureExtractor.from_pretrained(str(ckpt))
    current = {}

    def same_input(mel, length=3000, *, axis=-1):  # replaces whisper.transcribe's pad_or_trim
        return current["features"]

    transcribe_module = sys.modules["whisper.transcribe"]  # (whisper.transcribe is also the function's name)
    transcribe_module.pad_or_trim = same_input
    names = [f"{i:02d}" for i in range(1, 25)]
    clips = {n: read_audio(SAMPLES / f"{n}.flac", 16000) for n in names}
    gap = np.zeros(4800, np.float32)
    long = np.concatenate([x for n in names for x in (clips[n], gap)])
    windows = {}  # name -> (audible samples, offset in seconds)
    for name, audio in list(clips.items()) + [("long", long)]:
        for k, w in enumerate(plan_windows(audio)):
            key = name if name != "long" else f"long{k}"
            windows[key] = (audio[w.speech_start : w.speech_end], w.speech_start / 16000)
    record = {"setup": "pip install --target /tmp/owhisper --no-deps openai-whisper==20250625 more-itertools",
              "command": "PYTHONPATH=/tmp/owhisper:. python " + " ".join(sys.argv), "whisper_version": whisper.__version__,
              "checkpoint": json.loads((ckpt / "speechctl.json").read_text()).get("package"), "results": {}}
    for mode, beam in (("greedy", None), ("beam5", 5)):
        for name, (audio, offset) in windows.items():
            current["features"] = features(audio, sampling_rate=16000, return_tensors="pt").input_features[0]
            result = whisper.transcribe(model, audio, language="en", temperature=0.0, beam_size=beam, word_timestamps=True,
                                        condition_on_previous_text=False, fp16=False, verbose=None)
            record["results"].setdefault(mode, {})[name] = [
                {"start": round(s["start"] + offset, 3), "end": round(s["end"] + offset, 3), "text": s["text"], "tokens": s["tokens"],
                 "words": [{"word": w["word"], "start": round(w["start"] + offset, 3), "end": round(w["end"] + offset, 3),
                            "probability": round(w["probability"], 4)} for w in s.get("words", [])]}
                for s in result["segments"]
            ]
            print(mode, name, result["text"].strip(), flush=True)
    # one line per clip and decoding: small, and diffs stay readable
    lines = [f'"{k}": {json.dumps(v)}' for k, v in record.items() if k != "results"]
    for mode, results in record["results"].items():
        for name, segments in results.items():
            lines.append(f'"{mode}/{name}": {json.dumps(segments, separators=(",", ":"))}')
    Path(out_path).write_text("{\n" + ",\n".join(lines) + "\n}\n")


if __name__ == "__main__":
    main(sys.argv[1])
