"""CFG pairs in vLLM's scheduler: a ``Scheduler`` / ``AsyncScheduler`` subclass (vLLM's
``scheduler_cls`` extension point) that keeps the two members of every pair in lock-step.

A pair (conditional + unconditional request, same prompt length) must produce its real samples
in the same steps, because the model merges their logits and feeds both the same token
(``runtime/guidance.py``). The stock scheduler can split a pair three ways: the token budget runs
out between the two, KV allocation fails for the second, or preemption takes one. This mixin
prevents each (see ``_allocate``):

* order: pair members sit next to each other, pairs before other running requests (so
  preemption, which takes the last running request, reaches other requests first);
* admission: a pair's prefill is never split (both prompts complete in one step, with their own
  prefix-cache hits) and is admitted only if the budget, a batch slot and KV blocks hold both;
* each step, the first member of a pair is allocated only if KV blocks for both fit, and a member
  whose partner was preempted is refused, so vLLM's own loop preempts it too;
* after ``schedule()``: a running member whose partner is not running is preempted, and every
  scheduled pair is checked (both scheduled, same position). A violation is counted
  (``pair_violations``) and raised when ``SPEECHCTL_STRICT_PAIRS=1`` (tests); the model fails
  such a request loudly either way.

A decode step in which none of that can happen (nothing waits, every running request computes one
token, and the budget and the free KV blocks hold them all: ``_plain_decode_step``) is left to
vLLM's own allocation, without the checks per request, and checked after only if vLLM did not
schedule every running request (always under ``SPEECHCTL_STRICT_PAIRS=1``).

It overrides the scheduler's public methods (``add_request``, ``schedule``,
``finish_requests``) and ``_preempt_request``; every read of the scheduler's internal state
(KV blocks, request counters, the preemption call) goes through ``vllm_compat``'s shims.
Supports FCFS scheduling without speculative decoding.
"""

from __future__ import annotations

import logging
import os

from speechctl.engine import vllm_compat
from speechctl.engine.pair_room import PairRoom
from speechctl.engine.params import EXTRA_ARGS_KEY

logger = logging.getLogger(__name__)


def pair_key(request) -> tuple[str | None, str | None]:
    """(key, partner key) of a request's stream parameters; (None, None) without them."""
    args = (request.sampling_params.extra_args or {}) if request.sampling_params else {}
    params = args.get(EXTRA_ARGS_KEY)
    return (params.key, params.partner) if params is not None else (None, None)


class PairScheduling:
    """Mixin over vLLM's ``Scheduler`` / ``AsyncScheduler`` (module doc). It also keeps generated
    blocks out of the prefix cache."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pair_of: dict[str, str] = {}  # request id -> partner request id
        self._id_of_key: dict[str, str] = {}
        self._step: dict | None = None
        # what the last step's bookkeeping saw: a decode step that admits and finishes nothing
        # leaves both alone, and then the O(requests) passes are skipped
        self._added = 0
        self._known = (-1, -1)  # (requests held, requests added) when finished pairs were last forgotten
        self._ordered_running: list = []
        self.pair_violations = 0
        self.pair_steps_plain = 0  # steps with pairs that vLLM allocated alone (_plain_decode_step)
        self.pair_steps_checked = 0  # and those allocated request by request (_allocate)
        self.strict_pairs = os.environ.get("SPEECHCTL_STRICT_PAIRS") == "1"
        # vLLM's allocation, and ours for the steps that schedule pairs (swapped in by schedule();
        # unpaired steps call vLLM's directly: no extra frames per request)
        self._allocation = vllm_compat.KvAllocation(self)
        self._room = PairRoom(self)
        self._paired_allocate = lambda request, *a, **kw: self._allocate(request, a, kw)
        # Prefix-cache only prompt blocks. A generated block's KV depends on the auxiliary tokens
        # the model sampled, which vLLM's block hashes do not cover: two requests with the same
        # prompt (every CFG partner of one length) would otherwise share blocks of different
        # audio after a preemption. Prompt audio is hashed (multimodal items), so prompts stay
        # shareable. (Generated blocks are then not hashed either: add_request.)
        vllm_compat.cache_prompt_blocks_only(self)

    # -- membership ------------------------------------------------------------------------------

    def add_request(self, request) -> None:
        self._added += 1
        vllm_compat.hash_prompt_blocks_only(request)  # host work per request and step saved
        key, partner = pair_key(request)
        if key is not None and partner is not None:
            self._id_of_key[key] = request.request_id
            if partner in self._id_of_key:
                other = self._id_of_key[partner]
                self._pair_of[request.request_id] = other
                self._pair_of[other] = request.request_id
        super().add_request(request)

    def _forget_finished_pairs(self) -> None:
        gone = [rid for rid in self._pair_of if rid not in self.requests]
        for rid in gone:
            del self._pair_of[rid]
        if gone:
            live = set(self._pair_of)
            self._id_of_key = {k: v for k, v in self._id_of_key.items() if v in live}

    def finish_requests(self, request_ids, finished_status):
        """Finishing (aborting) one member finishes its partner."""
        if request_ids is not None and self._pair_of:
            ids = {request_ids} if isinstance(request_ids, str) else set(request_ids)
            ids |= {self._pair_of[r] for r in ids if r in self._pair_of}
            request_ids = ids
        return super().finish_requests(request_ids, finished_status)

    # -- scheduling ------------------------------------------------------------------------------

    def schedule(self, *args, **kwargs):
        if not self._pair_of:
            return super().schedule(*args, **kwargs)
        import torch

        with torch.profiler.record_function("speechctl.pair_bookkeeping"):
            # Requests only leave when their count drops or, in the same interval, others came.
            if (len(self.requests), self._added) != self._known:
                self._forget_finished_pairs()
                self._known = (len(self.requests), self._added)
            if self.waiting or self.running != self._ordered_running:  # list == compares by identity first: C speed
                self._order_pairs()
                self._ordered_running = list(self.running)
        if self._plain_decode_step():
            # vLLM's own allocation cannot split a pair in this step: skip the per-request checks
            # (the pair scheduler's host cost per pair, issue 21 item 4) unless it did not
            # schedule every running request after all.
            running = len(self.running)
            self.pair_steps_plain += 1
            output = super().schedule(*args, **kwargs)
            if self.strict_pairs or len(output.num_scheduled_tokens) != running or output.preempted_req_ids:
                self._preempt_orphans(output)
                self._check_pairs(output)
            return output
        self.pair_steps_checked += 1
        self._step = {"budget": self.max_num_scheduled_tokens, "scheduled": {}, "preempted": set(), "encoder": 0}
        with self._allocation.replaced_by(self._paired_allocate):
            try:
                output = super().schedule(*args, **kwargs)
            finally:
                self._step = None
        self._preempt_orphans(output)
        self._check_pairs(output)
        return output

    def _plain_decode_step(self) -> bool:
        """Whether this step is one in which vLLM schedules every running request, one token
        each, and admits none: nothing waits, each running request computes one token, the budget
        holds them all and the free KV blocks hold a new block per request and decoder group (the
        most one token needs, without speculative decoding). Neither of the ways a pair splits
        (module doc) can happen then."""
        running = self.running
        if not running or vllm_compat.waiting_requests(self):
            return False
        if len(running) > self.max_num_scheduled_tokens:
            return False
        if vllm_compat.free_kv_blocks(self) < len(running) * self._room.decoder_groups:
            return False
        return all(vllm_compat.uncomputed_tokens(r) == 1 for r in running)

    def _order_pairs(self) -> None:
        self.running[:] = self._adjacent(self.running, pairs_first=True)
        waiting = list(self.waiting)
        order = self._adjacent(waiting, pairs_first=False)
        if order != waiting:  # FCFS queues are deques
            self.waiting.clear()
            self.waiting.extend(order)

    def _adjacent(self, requests: list, pairs_first: bool) -> list:
        """``requests`` with each partner moved right behind its pair's first member (and, with
        ``pairs_first``, all pairs ahead of unpaired requests); otherwise in the same order."""
        present = {r.request_id: r for r in requests}
        placed, pairs, others, merged = set(), [], [], []
        for r in requests:
            if r.request_id in placed:
                continue
            partner = present.get(self._pair_of.get(r.request_id, ""))
            group = [r] if partner is None or partner.request_id in placed else [r, partner]
            placed.update(x.request_id for x in group)
            (pairs if len(group) == 2 else others).extend(group)
            merged.extend(group)
        return pairs + others if pairs_first else merged

    def _allocate(self, request, args, kwargs):
        step = self._step  # installed by schedule() for a step that schedules pairs
        call = self._allocation.bind(request, args, kwargs)
        rid = request.request_id
        if rid not in self._pair_of:
            blocks = self._allocation.allocate(request, *args, **kwargs)
            if blocks is not None:
                step["budget"] -= call["num_new_tokens"]
                step["encoder"] += call.get("num_encoder_tokens", 0)
            return blocks
        partner = self.requests.get(self._pair_of[rid])
        if partner is None or partner.request_id in step["preempted"]:
            return None  # vLLM then preempts this member too (or leaves it waiting)
        if partner.request_id not in step["scheduled"] and not self._room.fits(request, partner, call, step["budget"],
                                                                               step["encoder"]):
            return None
        blocks = self._allocation.allocate(request, *args, **kwargs)
        if blocks is not None:
            step["scheduled"][rid] = call["num_new_tokens"]
            step["budget"] -= call["num_new_tokens"]
            step["encoder"] += call.get("num_encoder_tokens", 0)
        return blocks

    def _preempt_request(self, request, *args, **kwargs):
        if self._step is not None:
            self._step["preempted"].add(request.request_id)
        return super()._preempt_request(request, *args, **kwargs)

    def _preempt_orphans(self, output) -> None:
        """Preempt a running member whose partner is not running (so neither runs alone)."""
        scheduled = output.num_scheduled_tokens
        orphans = [
            r for r in self.running
            if r.request_id in self._pair_of
            and r.request_id not in scheduled
            and not vllm_compat.is_running(self.requests.get(self._pair_of[r.request_id]))
        ]
        if not orphans:
            return
        self.running[:] = [r for r in self.running if r not in orphans]
        for r in orphans:
            vllm_compat.preempt(self, r)
            if output.preempted_req_ids is not None:
                output.preempted_req_ids.add(r.request_id)

    def _check_pairs(self, output) -> None:
        scheduled = output.num_scheduled_tokens
        for rid in scheduled:
            pid = self._pair_of.get(rid)
            if pid is None:
                continue
            partner = self.requests.get(pid)
            here = self.requests[rid]
            if pid not in scheduled or partner is None or partner.num_computed_tokens != here.num_computed_tokens:
                self.pair_violations += 1
                message = (
                    f"speechctl: CFG pair {rid}/{pid} out of step: "
                    f"scheduled {scheduled.get(rid)}/{scheduled.get(pid)} tokens, "
                    f"positions {here.num_computed_tokens}/{getattr(partner, 'num_computed_tokens', None)}"
                )
                if self.strict_pairs:
                    raise RuntimeError(message)
                logger.warning(message)


def pair_scheduler_class(async_scheduling: bool) -> str:
    """Qualified name of the pairing scheduler for ``EngineArgs(scheduler_cls=...)``."""
    return f"{__name__}.{'AsyncPairScheduler' if async_scheduling else 'PairScheduler'}"


def __getattr__(name):
    # The scheduler classes import vLLM's scheduler lazily (it pulls in the whole engine core).
    if name in ("PairScheduler", "AsyncPairScheduler"):
        sync, asynchronous = vllm_compat.scheduler_classes()
        globals()["PairScheduler"] = type("PairScheduler", (PairScheduling, sync), {})
        globals()["AsyncPairScheduler"] = type("AsyncPairScheduler", (PairScheduling, asynchronous), {})
        return globals()[name]
    raise AttributeError(name)
