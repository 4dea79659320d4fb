"""Data parallelism (issue 8): whole jobs over independent engine replicas, results in job order.

The split, the placement of each replica and the merge are tested with a stand-in runner (fast);
then real replicas of the tiny model: DP=2 must give DP=1's outputs job by job, CFG pairs
included (a pair is made inside one replica from one job), through the API and `speechctl batch`.
"""

import json
import os
from dataclasses import dataclass

import numpy as np
import pytest

from speechctl.engine.data_parallel import ReplicaPool, placements, replica_of
from speechctl.errors import EngineError, InputError

TWO_CORES = len(os.sched_getaffinity(0)) >= 2


def _two_replicas_possible() -> bool:
    import torch

    return torch.cuda.device_count() >= 2 if torch.cuda.is_available() else TWO_CORES


# -- a stand-in replica: picklable, imported by the spawned children from this module -----------


@dataclass
class Job:
    id: str
    value: int


@dataclass
class Echo:
    id: str
    value: int
    cores: list
    visible: str | None
    pid: int


class EchoRunner:
    """Answers each job with where it ran; yields each group of 3 in reverse, so results come
    back out of job order (as finished requests do)."""

    def __init__(self, fail_start: bool = False):
        if fail_start:
            raise InputError("no such checkpoint: /nowhere")

    def run(self, jobs):
        group = []
        for job in jobs:
            if job.value < 0:
                raise ValueError("negative job")
            group.append(job)
            if len(group) == 3:
                yield from map(self._answer, reversed(group))
                group = []
        yield from map(self._answer, reversed(group))

    @staticmethod
    def _answer(job):
        cores = sorted(os.sched_getaffinity(0))
        return Echo(job.id, 2 * job.value, cores, os.environ.get("CUDA_VISIBLE_DEVICES"), os.getpid())


# -- split, placement, merge ---------------------------------------------------------------------


def test_round_robin_gives_whole_jobs_by_index():
    assert [replica_of(i, 2) for i in range(5)] == [0, 1, 0, 1, 0]
    assert [replica_of(i, 3) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert {replica_of(i, 1) for i in range(4)} == {0}


def test_cpu_placement_gives_each_replica_its_own_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    two = placements(2, on_gpu=False)
    assert [p.cores for p in two] == [(0, 1), (2, 3)]
    assert [p.env for p in two] == [{"OMP_NUM_THREADS": "2"}] * 2
    assert [p.cores for p in placements(2, tensor_parallel_size=2, on_gpu=False)] == [(0, 1), (2, 3)]
    with pytest.raises(InputError, match=r"data parallel size 3 x tensor parallel size 2 needs 6 CPU cores; 4 available"):
        placements(3, tensor_parallel_size=2, on_gpu=False)


def test_gpu_placement_is_vllms_slice_of_the_visible_devices(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [p.env for p in placements(2, on_gpu=True)] == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2,1,0")
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in placements(2, tensor_parallel_size=2, on_gpu=True)] == ["3,2", "1,0"]
    assert all(p.cores is None for p in placements(4, on_gpu=True))
    with pytest.raises(InputError, match=r"data parallel size 4 x tensor parallel size 2 needs 8 GPUs; 4 visible"):
        placements(4, tensor_parallel_size=2, on_gpu=True)
    with pytest.raises(InputError, match=">= 1"):
        placements(0, on_gpu=True)


@pytest.fixture(scope="module")
def echo_pool():
    if not TWO_CORES:
        pytest.skip("needs two CPU cores")
    pool = ReplicaPool(EchoRunner, 2, on_gpu=False)
    yield pool
    pool.close()


def test_pool_runs_job_i_on_replica_i_mod_n_and_merges_in_job_order(echo_pool):
    jobs = [Job(f"j{i}", i) for i in range(11)]
    results = list(echo_pool.run(jobs))
    assert [r.id for r in results] == [j.id for j in jobs]
    assert [r.value for r in results] == [2 * j.value for j in jobs]
    cores = sorted(os.sched_getaffinity(0))
    shares = [list(p.cores) for p in placements(2, on_gpu=False)]
    assert not set(shares[0]) & set(shares[1])
    for i, r in enumerate(results):  # job i ran on replica i % 2, on that replica's cores only
        assert r.cores == shares[replica_of(i, 2)], (i, r)
    assert len({r.pid for r in results}) == 2 and os.getpid() not in {r.pid for r in results}
    # The pool serves the next run (fewer jobs than replicas, then none at all).
    assert [r.value for r in echo_pool.run([Job("only", 5)])] == [10]
    assert list(echo_pool.run([])) == []
    assert sorted(os.sched_getaffinity(0)) == cores  # the launcher gave its own cores back


def test_pool_errors_are_one_line_and_stop_the_replicas():
    if not TWO_CORES:
        pytest.skip("needs two CPU cores")
    import functools

    with pytest.raises(EngineError, match=r"replica \d did not start: no such checkpoint: /nowhere"):
        ReplicaPool(functools.partial(EchoRunner, fail_start=True), 2, on_gpu=False)
    pool = ReplicaPool(EchoRunner, 2, on_gpu=False)
    with pytest.raises(InputError, match="job id 'a' repeats"):
        list(pool.run([Job("a", 1), Job("b", 2), Job("a", 3)]))
    with pytest.raises(EngineError, match="stopped"):
        list(pool.run([Job("c", 1)]))
    pool = ReplicaPool(EchoRunner, 2, on_gpu=False)
    with pytest.raises(EngineError, match="replica 1: ValueError: negative job"):
        list(pool.run([Job("a", 1), Job("b", -1)]))
    assert all(proc.exitcode is not None for proc in pool._procs)


# -- vLLM's side ---------------------------------------------------------------------------------


@pytest.mark.engine
def test_vllm_refuses_offline_data_parallelism_for_dense_models(tiny_checkpoint, monkeypatch):
    """Why a replica runs vLLM at DP=1 (both 0.26 and 0.32 have these checks)."""
    from vllm.engine.arg_utils import EngineArgs

    from speechctl.engine import vllm_compat
    from speechctl.engine.engine import EngineConfig
    from speechctl.models import register

    register()
    args = EngineConfig(max_model_len=512).engine_args(str(tiny_checkpoint))
    with pytest.raises(ValueError, match="Non-MoE models do not support external data parallel mode"):
        EngineArgs(**args, data_parallel_size=2, data_parallel_rank=1).create_engine_config()
    for key, value in dict(VLLM_DP_SIZE="2", VLLM_DP_RANK="1", VLLM_DP_MASTER_IP="127.0.0.1", VLLM_DP_MASTER_PORT="29555").items():
        monkeypatch.setenv(key, value)
    vllm_compat.reread_environment()
    with pytest.raises(Exception, match="Offline data parallel mode is not supported/useful for dense models"):
        EngineArgs(**args).create_engine_config()
    monkeypatch.undo()
    vllm_compat.reread_environment()


def test_an_engine_is_one_replica():
    from speechctl.engine.engine import EngineConfig, SpeechEngine
    from speechctl.engine.vllm_compat import check_independent_replica

    with pytest.raises(EngineError, match="one replica"):
        SpeechEngine("unused", EngineConfig(data_parallel_size=2))

    class Engine:  # what vLLM builds for a DP rank of an MoE model: a DP group, lock-step
        class vllm_config:
            class parallel_config:
                data_parallel_size = 2

        dp_group = object()

    with pytest.raises(RuntimeError, match="independent replicas"):
        check_independent_replica(Engine)


# -- real replicas of the tiny model ----------------------------------------------------------------

SETTINGS = dict(max_num_seqs=8, max_model_len=512, dtype="float32")


def _speech(checkpoint, dp: int):
    """What ``speechctl batch --model CHECKPOINT`` with SETTINGS and ``-dp`` loads, loaded here
    under the same key, so that the CLI calls below reuse it. On CUDA with less memory each: the
    DP=1 engine (this process) and replica 0 share GPU 0."""
    import torch

    from speechctl import api
    from speechctl.cli.options import EngineChoice
    from speechctl.engine.engine import EngineConfig

    choice = EngineChoice(str(checkpoint), SETTINGS["max_num_seqs"], SETTINGS["max_model_len"], SETTINGS["dtype"], 1, dp)
    memory = {"gpu_memory_utilization": 0.3} if torch.cuda.is_available() else {}
    key = ("speech", choice.model, tuple(sorted(choice.config.items())))  # EngineChoice.speech()'s
    return api.shared(key, lambda: api.Speech(choice.model, engine_config=EngineConfig(**choice.config, **memory)))


@pytest.fixture(scope="module")
def speeches(tiny_checkpoint, engines_of_this_module):
    """DP=1 (this process) and DP=2 (two replica processes), shared with the CLI calls below."""
    if not _two_replicas_possible():
        pytest.skip("two replicas need two GPUs or two CPU cores")
    from speechctl import api

    one, two = _speech(tiny_checkpoint, 1), _speech(tiny_checkpoint, 2)
    assert two.engine is None and two.replicas.size == 2
    yield one, two
    for key in [k for k in api._LOADED if k[1] == str(tiny_checkpoint)]:
        api._LOADED.pop(key).close()


def _jobs(sample_rate: int):
    from speechctl.api import AsrJob, TtsJob
    from speechctl.engine.params import GREEDY, Guidance

    rng = np.random.default_rng(0)
    texts = ["Hi", "Hello world", "A longer sentence to speak aloud.", "x" * 30, "Ünïcödé ✓", "Seven"]
    jobs = [TtsJob(id=f"t{k}", text=t, audio_sampling=GREEDY, max_seconds=0.5 + 0.2 * k) for k, t in enumerate(texts)]
    jobs += [TtsJob(id=f"cfg{i}", text=f"Guided number {i}.", audio_sampling=GREEDY, max_seconds=1.0, guidance=Guidance(scale=2.5)) for i in range(3)]
    jobs.insert(2, TtsJob(id="voice", text="with a voice", voice=rng.uniform(-0.5, 0.5, sample_rate // 2).astype(np.float32), audio_sampling=GREEDY, max_seconds=1.0))
    jobs.insert(5, AsrJob(id="asr", audio=rng.uniform(-0.5, 0.5, sample_rate).astype(np.float32), max_tokens=12))
    jobs.append(TtsJob(id="empty", text=" "))  # fails in its replica, reported in its place
    return jobs


@pytest.mark.engine
def test_two_replicas_give_one_engines_outputs_in_job_order(speeches):
    import torch

    one, two = speeches
    jobs = _jobs(one.sample_rate)
    assert two.sample_rate == one.sample_rate
    single = {r.id: r for r in one.run(jobs)}
    results = list(two.run(jobs))
    assert [r.id for r in results] == [j.id for j in jobs]  # merged in job order
    # On CUDA the codec encodes input audio (the voice, the ASR clip) with cuDNN's float32
    # convolutions in TF32 (torch's default), their algorithms chosen by batch shape: a replica's
    # share batches differently, its codes may differ, and a random model's transcript of noise
    # with them (seen on two H200s). Exact for them on the CPU; text-only jobs exact everywhere.
    inexact = {"voice", "asr"} if torch.cuda.is_available() and torch.backends.cudnn.allow_tf32 else set()
    for r in results:
        ref = single[r.id]
        assert r.error == ref.error, r.id
        if r.id == "empty":
            assert r.error
        elif r.id in inexact:
            assert (r.text if r.task == "asr" else len(r.audio)), r.id
        elif r.task == "asr":
            assert r.text == ref.text
        else:  # greedy: the same codes on every stream; the codec decodes them to the same audio
            # up to float rounding (a replica has one core, so its kernels split work differently)
            np.testing.assert_array_equal(r.codes, ref.codes, err_msg=r.id)
            np.testing.assert_allclose(r.audio, ref.audio, rtol=0, atol=1e-6, err_msg=r.id)


@pytest.mark.engine
def test_batch_with_cfg_items_at_two_replicas_equals_one_engine(speeches, tiny_checkpoint, tmp_path):
    import soundfile as sf
    from click.testing import CliRunner

    from speechctl.cli import cli

    lines = [{"id": f"plain{i}", "task": "tts", "text": f"Plain item {i}.", "audio_temperature": 0, "max_seconds": 0.6} for i in range(3)]
    for i in range(4):  # sampled CFG pairs: counter-based noise, so a seed fixes the output
        lines.insert(2 * i, {"id": f"cfg{i}", "task": "tts", "text": f"Guided item {i}.", "cfg": 1.5 + i, "seed": i, "max_seconds": 0.8})
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    base = ["batch", str(manifest), "--model", str(tiny_checkpoint)]
    base += [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()]
    from speechctl import api

    loaded = dict(api._LOADED)
    outs = {}
    for dp in (1, 2):
        outs[dp] = tmp_path / f"dp{dp}"
        result = CliRunner().invoke(cli, base + ["-o", str(outs[dp]), "-dp", str(dp)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    assert api._LOADED == loaded  # the CLI ran on the fixture's engines (speeches)
    records = [json.loads(line) for line in (outs[2] / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == [line["id"] for line in lines]  # written in manifest order
    assert all(r["status"] == "ok" for r in records), records
    for line in lines:  # 16-bit PCM of audio equal up to float rounding (see above): one step at most
        name = f"{line['id']}.wav"
        a, b = (sf.read(str(out / name), dtype="int16")[0].astype(int) for out in (outs[2], outs[1]))
        assert a.shape == b.shape and np.abs(a - b).max() <= 1, name
    assert sorted(p.name for p in outs[2].iterdir()) == sorted([f"{line['id']}.wav" for line in lines] + ["results.jsonl"])


@pytest.mark.engine
@pytest.mark.parametrize(
    "args, fragment",
    [
        (["tts", "Hi", "-o", "x.wav", "-dp", "2"], "tts runs one engine: --data-parallel-size is for speechctl batch"),
        (["chat", "--input", "in.wav", "-dp", "2"], "chat runs one engine: --data-parallel-size is for speechctl batch"),
        (["batch", "m.jsonl", "-o", "out", "-dp", "64"], "data parallel size 64 x tensor parallel size 1 needs 64"),
    ],
)
def test_bad_data_parallel_size_is_a_one_line_error(tmp_path, monkeypatch, tiny_checkpoint, args, fragment):
    from click.testing import CliRunner

    from speechctl.cli import cli

    args = args + ["--model", str(tiny_checkpoint)]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.jsonl").write_text('{"id": "a", "task": "tts", "text": "Hello."}\n')
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and fragment in lines[0], result.stderr
    usage = CliRunner().invoke(cli, ["batch", "m.jsonl", "-o", "out", "-dp", "0"])
    assert usage.exit_code == 2 and "-dp" in usage.stderr
