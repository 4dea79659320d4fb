"""The host mirror of generated tokens (engine/runtime/readback.py), on the CPU."""

import numpy as np
import torch

from speechctl.engine.runtime.readback import Readback


def _readback(device: torch.device) -> Readback:
    return Readback(slots=3, max_rows=4, max_len=6, num_codebooks=2, pad=-1, device=device)


def test_host_ring_stays_on_the_host_under_a_default_device_context():
    # vLLM builds the model, and so the runtime's buffers, under `with torch.device(<gpu>)`: a
    # host buffer that does not name the CPU lands on the GPU there (on CUDA, pinning it then
    # fails: "Only dense CPU tensors can be pinned", the H200's eleventh-session failure)
    device = torch.device("cuda" if torch.cuda.is_available() else "meta")
    with device:
        rb = _readback(device)
    assert rb.record.device.type == device.type
    assert all(copy.host.device.type == "cpu" for copy in rb._ring)
    assert all(copy.host.is_pinned() for copy in rb._ring) == (device.type == "cuda")


def test_rows_land_in_the_mirror_of_their_slot_and_epoch_only():
    rb = _readback(torch.device("cpu"))
    rb.claimed([0, 1, 2], [1, 2, 1])  # slot 1 was claimed again (epoch 2)
    # [tokens K=2 | slot | g | flags (1 = real, 2 = desync) | epoch]
    rows = [[5, 6, 0, 0, 1, 1],   # slot 0, step 0
            [7, 8, 2, 0, 3, 1],   # slot 2, step 0, desynced pair
            [9, 9, 1, 0, 1, 1],   # slot 1's previous request (epoch 1, aborted): dropped
            [4, 4, 0, 1, 0, 1]]   # not a real sample: dropped
    rb.record[:4] = torch.tensor(rows)
    rb.after_step(4)
    (a, da), (b, db), (c, _) = rb.collect([(0, 0, 1), (2, 0, 1), (1, 0, 1)])
    assert a.tolist() == [[5, 6]] and da == 0
    assert b.tolist() == [[7, 8]] and db == 1
    assert c.tolist() == [[-1, -1]]
    assert rb.done.tolist() == [1, 0, 1]
    assert np.all(rb.tokens[0, 1:] == -1)


def test_steps_fold_in_batches_and_lose_nothing():
    """Copies wait in the ring until the mirror is read or the ring is full; then the done ones
    fold in one pass. Over more steps than the ring holds every real row lands, a desync seen
    at any step stays seen, and a slot claimed again drops its previous request's rows."""
    from speechctl.engine.runtime import readback

    rb = _readback(torch.device("cpu"))
    rb.claimed([0, 1], [1, 1])
    steps = readback.RING + 5
    for step in range(steps):
        g = min(step, rb.max_len)
        desync = 2 if step == 3 else 0  # slot 1's pair desynced once
        rb.record[:2] = torch.tensor([[step, -step, 0, g, 1, 1], [10 + step, 0, 1, g, 1 | desync, 1]])
        rb.after_step(2)
    assert sum(copy.pending for copy in rb._ring) == 5  # the first RING folded when the ring filled
    (a, da), (b, db) = rb.collect([(0, 0, 4), (1, 0, 4)])
    assert a[:, 0].tolist() == [0, 1, 2, 3] and da == 0 and db == 1
    assert rb.done.tolist() == [rb.max_len + 1, rb.max_len + 1, 0]
    assert not any(copy.pending for copy in rb._ring)
    rb.record[:1] = torch.tensor([[7, 7, 1, 0, 1, 1]])  # slot 1's old request (epoch 1), a step late
    rb.after_step(1)
    rb.claimed([1], [2])
    (c, dc), = rb.collect([(1, 0, 1)])
    assert rb.done[1] == 0 and dc == 0
