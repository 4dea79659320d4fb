"""The multi-stream decoding engine on vLLM (import ``speechctl.engine.engine`` for the engine;
this package stays import-light so the CLI starts fast)."""
