"""Plain-PyTorch reference of the multi-stream speech LM: no vLLM, no KV cache, no batching.

Independent of speechctl's engine code: the backbone is transformers' own implementation, the
delay layout and the decoding rules are written out here step by step with Python integers.
Every generation step recomputes the whole sequence. Greedy only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file


@dataclass
class RefRequest:
    prompt_ids: list[int]  # one <|audio|> placeholder per audio item
    audio_items: list[np.ndarray]  # [K, T] codes each
    max_tokens: int
    stop_ids: tuple[int, ...] = ()
    starts_in_audio: bool = False
    allow_audio: bool = True
    max_frames: int = 1 << 30
    min_frames: int = 1
    # Classifier-free guidance by batch doubling: the unconditional prompt runs beside the
    # conditional one and both continue with the same (guided) tokens.
    uncond_prompt_ids: list[int] | None = None
    cfg_scale: float = 1.0
    cfg_streams: str = "both"  # text | audio | both
    cfg_top_k: int = 0
    # The last audio item is speech the model continues: its steps end where its lead stream's
    # last frame is (each delayed stream's last frames still to come), and the first generated
    # steps carry those frames where a fresh audio would hold BOS.
    continues: bool = False


class ReferenceModel:
    def __init__(self, path: str | Path):
        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        s = cfg["speechctl"]
        self.delays = [int(d) for d in s["delays"]]
        self.C = int(s["codebook_size"])
        self.K = len(self.delays)
        self.BOS, self.EOS, self.PAD = self.C, self.C + 1, self.C + 2
        self.Va = self.C + 3
        t = s["tokens"]
        self.audio_bos, self.audio, self.audio_eos = t["audio_bos"], t["audio"], t["audio_eos"]
        config = transformers.AutoConfig.from_pretrained(path)
        backbone_cls = {
            "llama": transformers.LlamaModel,
            "qwen3": transformers.Qwen3Model,
            "qwen2": transformers.Qwen2Model,
        }[config.model_type]
        config._attn_implementation = "eager"
        self.backbone = backbone_cls(config).eval().float()
        weights = load_file(str(path / "model.safetensors"))
        state = {k[len("model.") :]: v.float() for k, v in weights.items() if k.startswith("model.")}
        missing, unexpected = self.backbone.load_state_dict(state, strict=False)
        assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
        self.lm_head = weights["lm_head.weight"].float()
        self.audio_embed = weights["audio_embed.weight"].float().view(self.K, self.Va, -1)
        self.audio_head = weights["audio_head.weight"].float().view(self.K, self.Va, -1)

    # The delay layout, written out position by position.
    def interleave(self, codes: np.ndarray) -> list[list[int]]:
        T = codes.shape[1]
        steps = []
        for s in range(T + max(self.delays) + 1):
            frame = []
            for k, d in enumerate(self.delays):
                if s < d:
                    frame.append(self.BOS)
                elif s < d + T:
                    frame.append(int(codes[k, s - d]))
                elif s == d + T:
                    frame.append(self.EOS)
                else:
                    frame.append(self.PAD)
            steps.append(frame)
        return steps

    def _embed(self, primary: list[int], aux: list[list[int]]) -> torch.Tensor:
        emb = self.backbone.embed_tokens(torch.tensor(primary))
        for k in range(self.K):
            emb = emb + self.audio_embed[k][torch.tensor([a[k] for a in aux])]
        return emb

    @torch.no_grad()
    def _last_hidden(self, primary, aux) -> torch.Tensor:
        emb = self._embed(primary, aux)[None]
        pos = torch.arange(len(primary))[None]
        return self.backbone(inputs_embeds=emb, position_ids=pos).last_hidden_state[0, -1]

    def _expand(self, prompt_ids, audio_items, continues: bool = False):
        primary, aux = [], []
        items = iter(audio_items)
        for tok in prompt_ids:
            if tok == self.audio:
                codes = next(items)
                steps = self.interleave(codes)
                if continues and codes is audio_items[-1]:
                    steps = steps[: codes.shape[1]]  # up to the lead stream's (delay 0) last frame
                for frame in steps:
                    primary.append(self.audio)
                    aux.append(frame)
            else:
                primary.append(tok)
                aux.append([self.PAD] * self.K)
        return primary, aux

    def _logits(self, primary, aux):
        h = self._last_hidden(primary, aux)
        return self.lm_head @ h, torch.einsum("kvh,h->kv", self.audio_head, h)

    def _guide(self, req, cond, uncond, text: bool):
        """l = l_u + s * (l_c - l_u); with a CFG top-k, the conditional logits restricted to the
        top-k tokens of the guided ones (Dia)."""
        merged = uncond + req.cfg_scale * (cond - uncond)
        if req.cfg_top_k:
            kth = merged.topk(req.cfg_top_k, dim=-1).values[..., -1:]
            merged = torch.where(merged >= kth, cond, torch.full_like(cond, float("-inf")))
        guided = req.cfg_streams in (("text", "both") if text else ("audio", "both"))
        return merged if guided else cond

    def generate(self, req: RefRequest, forced=None) -> tuple[list[int], np.ndarray]:
        """Greedy generation. With ``forced = (ids, aux)`` (another implementation's output) the
        reference follows those tokens instead and records in ``self.disagreements`` every
        (step, stream, gap) where a forced free choice is not its own argmax; ``gap`` is how much
        higher the reference scores its choice (a numerical tie when tiny). Forced rule tokens
        (BOS/EOS/PAD, the primary during audio) must match exactly."""
        self.disagreements = []
        primary, aux = self._expand(req.prompt_ids, req.audio_items, req.continues)
        continued = req.audio_items[-1] if req.continues else None
        guided = req.cfg_scale != 1.0
        if guided:
            u_primary, u_aux = self._expand(req.uncond_prompt_ids, [])
            assert len(u_primary) == len(primary), "CFG prompts must have the same length"
        lead = int(np.argmin(self.delays))
        audio_start = 0 if req.starts_in_audio else None  # generated index of audio step 0
        frames = None  # frame count once the lead stream emitted EOS
        out_ids, out_aux = [], []
        for g in range(req.max_tokens):
            logits, aux_logits = self._logits(primary, aux)
            if guided:
                u_logits, u_aux_logits = self._logits(u_primary, u_aux)
                logits = self._guide(req, logits, u_logits, text=True)
                aux_logits = self._guide(req, aux_logits, u_aux_logits, text=False)
            if audio_start is not None and g >= audio_start:
                a = g - audio_start
                frame = []
                for k, d in enumerate(self.delays):
                    if a < d and continued is not None and a == g and continued.shape[1] + a - d >= 0:
                        tok_k = int(continued[k, continued.shape[1] + a - d])  # the continued speech's frame
                    elif a < d:
                        tok_k = self.BOS
                    elif frames is not None and a == frames + d:
                        tok_k = self.EOS
                    elif frames is not None and a > frames + d:
                        tok_k = self.PAD
                    elif k == lead and frames is None and a - d >= req.max_frames:
                        tok_k = self.EOS
                    else:
                        allowed = aux_logits[k].clone()
                        allowed[self.C :] = float("-inf")
                        if k == lead and frames is None and a - d >= req.min_frames:
                            allowed[self.EOS] = aux_logits[k, self.EOS]
                        tok_k = self._choose(allowed, forced, g, 1 + k)
                    frame.append(tok_k)
                if frames is None and frame[lead] == self.EOS:
                    frames = a - self.delays[lead]
                if frames is not None and a >= frames + max(self.delays) + 1:
                    tok = self.audio_eos
                else:
                    tok = self.audio
            else:
                frame = [self.PAD] * self.K
                masked = logits.clone()
                masked[self.audio] = float("-inf")
                masked[self.audio_eos] = float("-inf")
                if not req.allow_audio:
                    masked[self.audio_bos] = float("-inf")
                tok = self._choose(masked, forced, g, 0)
            if forced is not None:
                if g >= len(forced[0]):
                    raise AssertionError(f"the other output stopped early, at step {g}")
                if [forced[0][g], *map(int, forced[1][g])] != [tok, *frame]:
                    raise AssertionError(f"step {g}: rule tokens differ: {[tok, *frame]} vs "
                                         f"{[forced[0][g], *map(int, forced[1][g])]}")
            out_ids.append(tok)
            out_aux.append(frame)
            primary.append(tok)
            aux.append(frame)
            if guided:
                u_primary.append(tok)
                u_aux.append(frame)
            if tok == self.audio_bos:
                audio_start, frames = g + 1, None
            elif tok == self.audio_eos:
                audio_start = None
            if tok in req.stop_ids:
                break
        if forced is not None and len(forced[0]) != len(out_ids):
            raise AssertionError(f"the other output ran on past step {len(out_ids)}")
        return out_ids, np.array(out_aux, dtype=np.int64).reshape(-1, self.K)

    def _choose(self, logits: torch.Tensor, forced, step: int, stream: int) -> int:
        best = int(logits.argmax())
        if forced is None:
            return best
        token = int(forced[0][step]) if stream == 0 else int(forced[1][step][stream - 1])
        if token != best:
            self.disagreements.append((step, stream, float(logits[best] - logits[token])))
        return token
