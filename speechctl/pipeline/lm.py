"""The response LM stage: any vLLM text model, streamed token by token, cut into phrases.

``TextLm`` owns one in-process vLLM ``LLMEngine`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, like the
speech engine) with a bounded KV cache, so that it can share the process (and a GPU, by memory
fraction) with the ASR and TTS engines. Requests use DELTA outputs: each step returns only the
new text. ``LmStage`` turns a user transcript into a chat prompt (the model's chat template, or
``user: ...\\nassistant:`` without one), keeps a short history, and emits the reply phrase by
phrase (:class:`PhraseSplitter`) so TTS can start on the first phrase.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from speechctl.pipeline.phrases import PhraseSplitter
from speechctl.pipeline.stage import Piece, Stage


@dataclass
class LmConfig:
    """How the response LM runs and samples. GPU memory: ``gpu_memory_utilization`` (a fraction
    of the device, shared with the other stages); CPU: ``kv_cache_bytes``."""

    max_tokens: int = 96
    min_tokens: int = 0  # = max_tokens for fixed-length replies (benchmarks, tests)
    temperature: float = 0.7
    top_p: float = 0.95
    seed: int | None = 0
    system: str | None = "You are a helpful voice assistant. Answer briefly."
    history_turns: int = 4  # earlier (user, assistant) exchanges kept in the prompt
    max_model_len: int = 2048
    max_num_seqs: int = 4
    kv_cache_bytes: int = 64 << 20
    gpu_memory_utilization: float = 0.25
    dtype: str = "auto"
    enforce_eager: bool | None = None  # default: eager on CPU, CUDA graphs on GPU
    load_format: str = "auto"  # "dummy": random weights (benchmarks of a model shape)

    def engine_args(self, model: str, on_gpu: bool) -> dict:
        args = dict(
            model=model,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            dtype=self.dtype,
            enforce_eager=(not on_gpu) if self.enforce_eager is None else self.enforce_eager,
            seed=0,
            load_format=self.load_format,
            use_tqdm_on_load=False,
        )
        if on_gpu:
            args["gpu_memory_utilization"] = self.gpu_memory_utilization
        else:
            args["kv_cache_memory_bytes"] = self.kv_cache_bytes
        return args


class TextLm:
    """A vLLM text model, stepped by the caller; ``step`` returns ``(id, new_text, finished)``."""

    def __init__(self, model: str | None = None, config: LmConfig | None = None):
        from speechctl.engine import vllm_compat
        from speechctl.models.text_lm import resolve_text_lm

        vllm_compat.check_vllm_version()
        vllm_compat.apply_engine_environment()
        from vllm.engine.arg_utils import EngineArgs

        from speechctl.accelerator import has_cuda

        self.config = config or LmConfig()
        self.model_dir = resolve_text_lm(model)
        args = EngineArgs(**self.config.engine_args(str(self.model_dir), has_cuda()))
        self._engine = vllm_compat.offline_engine(args)
        self.tokenizer = self._engine.get_tokenizer()
        self._live: set[str] = set()

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Token ids of a chat: the model's chat template, or a plain transcript without one."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return tok.encode(text, add_special_tokens=False)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return tok.encode(text)

    def submit(self, id: str, messages: list[dict], config: LmConfig | None = None) -> None:
        """Start a reply; ``config``'s sampling settings (default: the engine's config)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        c = config or self.config
        ids = self.prompt_ids(messages)
        room = c.max_model_len - len(ids)
        if room < 1:
            ids, room = ids[-(c.max_model_len - 1) :], 1
        params = SamplingParams(
            temperature=c.temperature,
            top_p=c.top_p,
            seed=c.seed,  # the same chat gets the same reply
            max_tokens=min(c.max_tokens, room),
            min_tokens=min(c.min_tokens, c.max_tokens, room),
            output_kind=RequestOutputKind.DELTA,
        )
        self._engine.add_request(id, {"prompt_token_ids": ids}, params)
        self._live.add(id)

    def step(self) -> list[tuple[str, str, bool]]:
        if not self._live:
            return []
        out = []
        for o in self._engine.step():
            if o.request_id in self._live:
                out.append((o.request_id, o.outputs[0].text, o.finished))
                if o.finished:
                    self._live.discard(o.request_id)
        return out

    def abort(self) -> None:
        if self._live:
            self._engine.abort_request(list(self._live))
            self._live.clear()

    def busy(self) -> bool:
        return bool(self._live)

    def close(self) -> None:
        """Shut the engine down and give its memory back."""
        if getattr(self, "_engine", None) is not None:
            from speechctl.engine import vllm_compat

            self._live.clear()
            vllm_compat.drop_engine(self, "_engine")


class LmStage(Stage):
    """Input: the user's transcript (a text piece with ``last``). Output: the reply's phrases
    (text pieces, the last one marked ``last``). An empty transcript gives an empty last piece:
    no reply."""

    name = "lm"

    def __init__(self, lm: TextLm, config: LmConfig | None = None, *, splitter=lambda: PhraseSplitter()):
        super().__init__()
        self.lm = lm
        self.config = config or lm.config  # sampling, system prompt, history (engines are shared)
        self._new_splitter = splitter
        self.history: list[tuple[str, str]] = []
        self._ids = itertools.count()
        self._request: tuple[str, int, str, PhraseSplitter] | None = None  # (id, turn, user text, splitter)
        self._reply = ""
        self._user_text: dict[int, str] = {}  # turn -> transcript so far

    def working(self) -> bool:
        return self._request is not None

    def step(self) -> list[Piece]:
        out = []
        while self.inbox:
            piece = self.inbox.popleft()
            text = self._user_text.get(piece.turn, "") + str(piece.data or "")
            if not piece.last:
                self._user_text[piece.turn] = text
                continue
            self._user_text.pop(piece.turn, None)
            if not text.strip():
                out.append(self.emit(piece.turn, "text", "", last=True))
                continue
            self._start(piece.turn, text.strip())
        if self._request is None:
            return out
        id, turn, user, splitter = self._request
        for _, delta, finished in self.lm.step():
            self._reply += delta
            # phrases keep a separating space, so that the pieces of a turn join into the reply
            out += [self.emit(turn, "text", p + " ") for p in splitter.push(delta)]
            if finished:
                out += [self.emit(turn, "text", p + " ") for p in splitter.finish()]
                out.append(self.emit(turn, "text", "", last=True))
                self.history = (self.history + [(user, self._reply.strip())])[-self.config.history_turns :]
                self._request = None
        return out

    def messages(self, user: str) -> list[dict]:
        """The chat so far (system prompt, kept history) and the user's new words."""
        messages = [{"role": "system", "content": self.config.system}] if self.config.system else []
        for u, a in self.history:
            messages += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        return messages + [{"role": "user", "content": user}]

    def _start(self, turn: int, user: str) -> None:
        self.lm.abort()
        id = f"lm{next(self._ids)}"
        self.lm.submit(id, self.messages(user), self.config)
        self._request = (id, turn, user, self._new_splitter())
        self._reply = ""

    def cancel(self) -> None:
        super().cancel()
        self.lm.abort()
        self._request = None
        self._user_text.clear()
