"""speechctl.threads: a worker thread started beside the step loop shortens Python's switch
interval (so that it gets the lock back promptly after each op), as configured."""

import sys

import pytest

from speechctl.errors import InputError
from speechctl.threads import SWITCH_INTERVAL_ENV, prompt_workers


@pytest.fixture(autouse=True)
def _restore_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)  # Python's default, whatever earlier tests left
    yield
    sys.setswitchinterval(before)


def test_a_worker_shortens_the_switch_interval_as_configured(monkeypatch):
    monkeypatch.delenv(SWITCH_INTERVAL_ENV, raising=False)
    prompt_workers()
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    sys.setswitchinterval(0.0001)  # never lengthened
    prompt_workers()
    assert sys.getswitchinterval() == pytest.approx(0.0001)
    sys.setswitchinterval(0.005)
    monkeypatch.setenv(SWITCH_INTERVAL_ENV, "0")  # left as it is
    prompt_workers()
    assert sys.getswitchinterval() == pytest.approx(0.005)
    monkeypatch.setenv(SWITCH_INTERVAL_ENV, "1.5")
    prompt_workers()
    assert sys.getswitchinterval() == pytest.approx(0.0015)
    for bad in ("soon", "-1"):
        monkeypatch.setenv(SWITCH_INTERVAL_ENV, bad)
        with pytest.raises(InputError, match=SWITCH_INTERVAL_ENV):
            prompt_workers()


def test_the_codec_worker_thread_and_asr_rendering_shorten_it(monkeypatch):
    from speechctl.asr.prerender import Prerender
    from speechctl.codecs.worker import DecodeQueue

    monkeypatch.delenv(SWITCH_INTERVAL_ENV, raising=False)

    class Cpu:  # (DecodeQueue reads only where the codec runs)
        device = type("device", (), {"type": "cpu"})()

    DecodeQueue(Cpu(), thread=False).close()  # decoding in the caller's thread: nothing to do
    assert sys.getswitchinterval() == pytest.approx(0.005)
    DecodeQueue(Cpu(), thread=True).close()
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    sys.setswitchinterval(0.005)
    Prerender(lambda windows: [], depth=2).close()
    assert sys.getswitchinterval() == pytest.approx(0.0005)
