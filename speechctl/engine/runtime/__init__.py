"""The per-step runtime of multi-stream models (runs inside vLLM's worker, imports no vLLM):

    slots.py     per-request device state (SlotTable) and the live requests' host facts
    inputs.py    input side: auxiliary tokens of the scheduled positions
    rules.py     output side: delay and end rules on the device
    sampling.py  per-stream sampling with counter-based noise
    guidance.py  classifier-free guidance: pair rows, merge logits, one token per pair
    repetition.py  repetition-aware sampling (Higgs' RAS)
    graphs.py    CUDA graphs and torch.compile of the per-step work
    warmup.py    every per-step graph a workload can meet, recorded at start-up
    runtime.py   StreamRuntime: admit -> inputs -> (forward) -> sample -> record
    tracker.py   StreamTracker, the vLLM logits processor that reports batch rows (imports vLLM)
"""

from speechctl.engine.runtime.graphs import compile_per_step_work
from speechctl.engine.runtime.runtime import StreamRuntime
from speechctl.engine.runtime.slots import slot_capacity

__all__ = ["StreamRuntime", "compile_per_step_work", "slot_capacity"]
