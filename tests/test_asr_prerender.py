"""speechctl.asr.prerender: windows rendered on one worker thread ahead of their admission."""

from __future__ import annotations

import threading

import pytest

from speechctl.asr.prerender import Prerender


class Recorder:
    """A render_many that notes its thread and calls and can be held until released."""

    def __init__(self):
        self.threads, self.calls = set(), []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, windows):
        self.release.wait(5)
        self.threads.add(threading.get_ident())
        self.calls.append([(audio, tuple(prompt)) for _, audio, prompt in windows])
        if any(audio == "bad" for _, audio, _ in windows):
            raise ValueError("bad audio")
        return [f"{key}={audio}:{prompt}" for key, audio, prompt in windows]  # (each window's own key reaches the renderer)


def test_windows_asked_for_ahead_are_rendered_once_in_chunks_on_the_worker():
    render = Recorder()
    pre = Prerender(render, depth=3, chunk=2)
    try:
        render.release.clear()  # hold the worker: what was asked for stays pending
        pre.ahead([(("s", i), lambda i=i: f"a{i}", [1]) for i in range(4)])
        assert len(pre._pending) == 3  # the depth: the fourth waits for a later call
        pre.ahead([(("s", 0), lambda: "a0", [1])])  # already pending: not again
        render.release.set()
        assert pre.take(("s", 0), lambda: "a0", [1]) == "('s', 0)=a0:[1]"
        assert pre.take(("s", 1), lambda: "a1", [1]) == "('s', 1)=a1:[1]"
        assert pre.take(("s", 2), lambda: "a2", [1]) == "('s', 2)=a2:[1]"
        assert pre.take(("s", 3), lambda: "a3", [1]) == "('s', 3)=a3:[1]"  # not asked for in time: rendered at once
        assert (pre.rendered_ahead, pre.rendered_inline, pre.calls) == (3, 1, 3)
        # chunks of two in the line's order, then the one rendered alone
        assert render.calls == [[("a0", (1,)), ("a1", (1,))], [("a2", (1,))], [("a3", (1,))]]
        assert render.threads and threading.get_ident() not in render.threads  # never on the caller's thread
    finally:
        pre.close()


def test_a_render_error_reaches_its_window_alone_and_forgotten_windows_are_dropped():
    render = Recorder()
    pre = Prerender(render, depth=8, chunk=4)

    def unreadable():
        raise OSError("unreadable")

    try:
        pre.ahead([(("x", 0), lambda: "bad", []), (("y", 0), lambda: "y", []), (("u", 0), unreadable, [])])
        with pytest.raises(ValueError, match="bad audio"):
            pre.take(("x", 0), lambda: "bad", [])
        assert pre.take(("y", 0), lambda: "y", []) == "('y', 0)=y:[]"  # its chunk-mate's error is not its own
        with pytest.raises(OSError, match="unreadable"):
            pre.take(("u", 0), unreadable, [])
        render.release.clear()
        pre.ahead([(("z", 0), lambda: "z", []), (("w", 0), lambda: "w", [])])
        pre.forget(lambda key: key[0] != "z")  # z's input ended; w still wanted
        assert list(pre._pending) == [("w", 0)]
        pre.clear()  # the caller stopped: nothing is left pending
        render.release.set()
        assert not pre._pending
    finally:
        pre.close()


def test_log_mel_on_a_gpu_needs_one(tmp_path):
    """WhisperConfig.feature_device="cuda" without a GPU: a one-line error before any engine."""
    from speechctl.accelerator import has_cuda
    from speechctl.asr import WhisperAsr, WhisperConfig
    from speechctl.errors import SpeechctlError
    from test_asr_reference import make_checkpoint

    if has_cuda():
        pytest.skip("a GPU is here")
    with pytest.raises(SpeechctlError, match="feature_device='cuda': no GPU here"):
        WhisperAsr(make_checkpoint(tmp_path / "en", "en"), WhisperConfig(feature_device="cuda"))
