"""The staged speech pipeline behind ``speechctl chat``.

* :mod:`~speechctl.pipeline.stage`: ``Piece``, ``Stage`` (input queue -> engine -> output pieces)
  and ``Pipeline`` (stages stepped cooperatively; downstream starts on upstream's first piece).
* stages: :mod:`~speechctl.pipeline.asr` (Whisper), :mod:`~speechctl.pipeline.lm` (any vLLM text
  model, phrase by phrase: :mod:`~speechctl.pipeline.phrases`), :mod:`~speechctl.pipeline.tts`
  (streaming TTS, :mod:`~speechctl.pipeline.streamer`), :mod:`~speechctl.pipeline.unified` (one
  speech LM: audio in, text and audio out).
* :mod:`~speechctl.pipeline.vad` (end of utterance), :mod:`~speechctl.pipeline.chat` (the live
  loop over an audio device, barge-in), :mod:`~speechctl.pipeline.build` (stages from model names).

Importing this package loads no torch or vLLM; the stages load their engines when built.
"""
