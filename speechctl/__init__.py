"""speechctl: speech language models, fast, on stock vLLM."""

__version__ = "0.1.0"
