import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# On CUDA, vLLM's Triton attention kernels multiply float32 in TF32 (the default of Triton's
# tl.dot; vLLM keeps torch's own matmuls at "highest"), which moves the tiny random test models'
# logits far enough to flip greedy choices that are not near ties (Dia: 0.149, docs/gpu.md,
# twenty-fifth session). The parity tests check our rules against references computed in IEEE
# float32, so the kernels compute in it too (a cache-invalidating Triton setting, read when a
# kernel is compiled). No effect on the CPU.
os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Keep the embedded model and other caches out of the user's home."""
    import os

    os.environ["SPEECHCTL_CACHE"] = str(tmp_path_factory.mktemp("speechctl-cache"))
    # Tests that take the default model mean the random `tiny` (its layout, its speed), whether or
    # not this install ships speechctl's voice; tests/test_voice_default.py unsets it.
    os.environ["SPEECHCTL_MODEL"] = "tiny"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A random multi-stream checkpoint in float32. Weights are drawn with a larger spread than
    the default model's so that greedy choices are separated by more than float rounding."""
    from speechctl.models.generic.checkpoint import MultiStreamRecipe, create_multistream_checkpoint

    path = tmp_path_factory.mktemp("ckpt") / "tiny-llama"
    return create_multistream_checkpoint(path, MultiStreamRecipe(seed=3, init_std=0.3))


@pytest.fixture(scope="session")
def reference(tiny_checkpoint):
    from reference import ReferenceModel

    return ReferenceModel(tiny_checkpoint)


@pytest.fixture
def shared_engines_closed():
    """For a test whose CLI calls load shared engines (``api.shared``): they are closed after it,
    failed or not, so that a failure does not keep the device's memory from the tests after it."""
    yield
    from speechctl import api

    api.close_shared()


@pytest.fixture(scope="module")
def engines_of_this_module():
    """Start with engines of this module's own (also for its CLI calls): when vLLM frees an
    engine it tears down process-wide state that every in-process engine steps with, so an
    engine loaded by an earlier test module may fail here until a new one is made."""
    import gc

    from speechctl import api

    api.close_shared()  # free them now, not in the middle of a test
    gc.collect()


@pytest.fixture
def progress():
    """``progress(line)``: a timestamped line in SPEECHCTL_TEST_LOG while a test runs (where it is
    set: the device scripts), for tests whose steps take minutes on the GPU (engine starts that
    compile): a test cut off by a call's limit still tells how far it got."""
    import os
    import time

    path = os.environ.get("SPEECHCTL_TEST_LOG")
    started = time.time()

    def line(text: str) -> None:
        if path:
            with open(path, "a") as f:
                f.write(f"    [{time.time() - started:6.1f} s] {text}\n")

    return line


def pytest_runtest_logreport(report):
    """With SPEECHCTL_TEST_LOG set (benchmarks/h200.sh sets it), each test's outcome as it ends,
    and each failure's traceback: a run that a device call's time limit kills says what failed
    and why (pytest's own summary comes only at the end)."""
    import os

    path = os.environ.get("SPEECHCTL_TEST_LOG")
    if not path or (report.when != "call" and report.passed):
        return
    with open(path, "a") as f:
        f.write(f"{report.outcome.upper()} {report.nodeid} ({report.when}, {report.duration:.1f} s)\n")
        if report.failed:
            lines = report.longreprtext.splitlines()
            f.write("\n".join(lines[-40:]) + "\n\n")
        elif report.skipped and isinstance(report.longrepr, tuple):
            f.write(f"    {report.longrepr[2]}\n")
