"""Plain-PyTorch reference of the AR+NAR family: no vLLM, no KV cache, no batching, no padding.

Written apart from ``speechctl/models/valle/`` (it imports nothing of it) from the family's
definition:

* AR: ``reference.ReferenceModel`` (transformers' Llama, full recompute, the rules written out),
  which reads the checkpoint's one audio stream as codebook 1.
* NAR, for one utterance, pass j = 1..K-1 (codebook 0 is the AR's): sequence = text bytes
  (``text_embed``), the voice's frames (sum of all K codebook embeddings), the utterance's frames
  (sum of codebooks 0..j-1); full attention, no mask; Llama layers (RoPE on halves, grouped-query
  attention, SwiGLU) whose RMSNorms are AdaLN: ``rmsnorm(h) * (1 + a) + b``, ``[a; b] =
  adaln @ stage_embed[j-1]``; head j = rows (j-1)*C .. j*C-1 of ``heads``; greedy. Each step
  recomputes everything in float32 with explicit loops over heads.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from reference import ReferenceModel, RefRequest


class ValleReference:
    def __init__(self, path: str | Path):
        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        self.ar = ReferenceModel(path)
        nar = cfg["speechctl"]["nar"]
        self.K, self.C = int(nar["num_codebooks"]), int(cfg["speechctl"]["codebook_size"])
        self.EOS = self.C + 1  # the AR stream's EOS (codes, then BOS, EOS, PAD)
        w = {k: v.float() for k, v in load_file(str(path / "nar" / "model.safetensors")).items()}
        if nar.get("shared_layers"):
            ar = load_file(str(path / "model.safetensors"))
            w.update({k[len("model."):]: v.float() for k, v in ar.items() if k.startswith("model.")})
            dims = dict(layers=cfg["num_hidden_layers"], heads=cfg["num_attention_heads"],
                        kv=cfg["num_key_value_heads"], eps=cfg.get("rms_norm_eps", 1e-5),
                        theta=(cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0)))
        else:
            dims = dict(layers=nar["num_layers"], heads=nar["num_heads"], kv=nar["num_kv_heads"],
                        eps=nar["rms_norm_eps"], theta=nar["rope_theta"])
        self.w, self.dims = w, dims

    # -- the NAR stage ---------------------------------------------------------------------------

    def _norm(self, x, name: str, stage: torch.Tensor) -> torch.Tensor:
        w = self.w
        rms = x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + self.dims["eps"])
        ab = w[name + ".adaln.weight"] @ stage
        a, b = ab[: x.shape[-1]], ab[x.shape[-1]:]
        return (rms * w[name + ".weight"]) * (1 + a) + b

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        """x [L, d] of one head: position m's pair (i, i + d/2) turned by m * theta^(-2i/d)."""
        L, d = x.shape
        out = torch.empty_like(x)
        for i in range(d // 2):
            angle = torch.arange(L, dtype=torch.float32) * self.dims["theta"] ** (-2 * i / d)
            c, s = torch.cos(angle), torch.sin(angle)
            out[:, i] = x[:, i] * c - x[:, i + d // 2] * s
            out[:, i + d // 2] = x[:, i + d // 2] * c + x[:, i] * s
        return out

    def nar_logits(self, text_ids, voice: np.ndarray, codes: list[np.ndarray], j: int) -> torch.Tensor:
        """Codebook j's logits [T, C] given the codebooks 0..j-1 of the utterance so far."""
        w, C, dims = self.w, self.C, self.dims
        table = w["audio_embed.weight"]
        rows = [w["text_embed.weight"][int(t)] for t in text_ids]
        for t in range(voice.shape[1]):
            rows.append(sum(table[k * C + int(voice[k, t])] for k in range(self.K)))
        T = len(codes[0])
        for t in range(T):
            rows.append(sum(table[k * C + int(codes[k][t])] for k in range(j)))
        h = torch.stack(rows)
        stage = w["stage_embed.weight"][j - 1]
        H = h.shape[1]
        nh, nkv = dims["heads"], dims["kv"]
        hd = H // nh
        for i in range(dims["layers"]):
            p = f"layers.{i}."
            x = self._norm(h, p + "input_layernorm", stage)
            q, k, v = (x @ w[p + f"self_attn.{n}_proj.weight"].T for n in ("q", "k", "v"))
            heads = []
            for head in range(nh):
                g = head // (nh // nkv)  # its key/value group
                qh = self._rope(q[:, head * hd:(head + 1) * hd])
                kh = self._rope(k[:, g * hd:(g + 1) * hd])
                weights = torch.softmax(qh @ kh.T / math.sqrt(hd), dim=-1)  # every position sees every position
                heads.append(weights @ v[:, g * hd:(g + 1) * hd])
            h = h + torch.cat(heads, dim=-1) @ w[p + "self_attn.o_proj.weight"].T
            x = self._norm(h, p + "post_attention_layernorm", stage)
            gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
            h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        out = self._norm(h[-T:], "norm", stage)
        return out @ w["heads.weight"][(j - 1) * C: j * C].T

    @torch.no_grad()
    def nar(self, text_ids, voice: np.ndarray | None, first: np.ndarray) -> np.ndarray:
        """[K, T] codes: codebook 0 given, 1..K-1 greedy."""
        voice = np.zeros((self.K, 0), np.int64) if voice is None else voice
        codes = [np.asarray(first)]
        for j in range(1, self.K):
            codes.append(self.nar_logits(text_ids, voice, codes, j).argmax(dim=-1).numpy())
        return np.stack(codes)

    # -- both stages ------------------------------------------------------------------------------

    @staticmethod
    def ar_request(req) -> RefRequest:
        """The AR stage's reference request of a request built by the family's prompts (its prompt
        ids, guidance and frame limits)."""
        return RefRequest(prompt_ids=req.prompt_ids, audio_items=req.audio_items, max_tokens=req.max_tokens,
                          stop_ids=tuple(req.stop_token_ids), starts_in_audio=True, max_frames=req.max_frames,
                          min_frames=req.min_frames, uncond_prompt_ids=req.uncond_prompt_ids,
                          cfg_scale=req.guidance.scale, cfg_streams=req.guidance.streams)

    @staticmethod
    def text_ids(text: str, voice_text: str | None = None) -> list[int]:
        """The NAR's text: UTF-8 bytes of the transcript and the text, joined by a space."""
        return list((text if voice_text is None else f"{voice_text} {text}").encode("utf-8"))

    def generate(self, req, text: str, voice_text: str | None = None) -> np.ndarray:
        """[K, T] greedy codes of a request built by the family's prompts for ``text``."""
        _, aux = self.ar.generate(self.ar_request(req))
        stream = list(aux[:, 0])
        first = np.asarray(stream[: stream.index(self.EOS)])
        voice = req.audio_items[0] if req.audio_items else None
        return self.nar(self.text_ids(text, voice_text), voice, first)
