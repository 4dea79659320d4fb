"""Whether both members of a CFG pair fit the step being scheduled (``pairs.py`` asks before it
lets vLLM allocate the first member): the step's token budget, a batch slot for each, their KV
blocks in every cache group, and, in an encoder-decoder engine, both encoder inputs. Every read
of the scheduler's state goes through ``vllm_compat``'s shims.
"""

from __future__ import annotations

from speechctl.engine import vllm_compat


class PairRoom:
    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.kv_groups = vllm_compat.kv_groups(scheduler)  # (block size, cross-attention?) per KV group
        self.decoder_groups = sum(not cross for _, cross in self.kv_groups)

    def fits(self, request, partner, call: dict, budget: int, encoder_used: int) -> bool:
        """Whether ``request`` (the member being allocated, vLLM's allocation ``call``) and its
        ``partner`` both fit in the ``budget`` tokens left and the free KV blocks;
        ``encoder_used``: encoder positions this step has scheduled so far."""
        scheduler = self.scheduler
        num_new = call["num_new_tokens"]
        hits = call.get("num_new_computed_tokens", 0) + call.get("num_external_computed_tokens", 0)
        free = vllm_compat.free_kv_blocks(scheduler)
        if vllm_compat.is_running(request):
            partner_new = vllm_compat.uncomputed_tokens(partner)
            if num_new == 1 and partner_new == 1 and budget >= 2 and free >= 2 * self.decoder_groups:
                # A decode step: each member needs at most one new block per group (the common
                # case, so skip counting the blocks they hold).
                return True
            self_blocks = self.new_blocks(request, request.num_computed_tokens + num_new)
        else:
            if hits + num_new < request.num_tokens:
                return False  # a pair's prefill is never split
            if len(scheduler.running) + 2 > vllm_compat.max_running_requests(scheduler):
                return False
            if not self.encoders_fit(partner, call, encoder_used):
                return False
            partner_new = partner.num_tokens - partner.num_computed_tokens
            self_blocks = self.new_blocks(request, request.num_tokens)
        if budget - num_new < partner_new:
            return False
        partner_blocks = self.new_blocks(partner, partner.num_computed_tokens + partner_new)
        return self_blocks + partner_blocks <= free

    def encoders_fit(self, partner, call: dict, encoder_used: int) -> bool:
        """Whether an encoder-decoder pair's two encoder inputs both run in this step: this
        member's (already counted by vLLM, ``num_encoder_tokens``) and its partner's, within the
        step's encoder budget and the encoder cache."""
        mine = call.get("num_encoder_tokens", 0)
        theirs = vllm_compat.encoder_kv_tokens(self.scheduler, partner)
        if not mine and not theirs:
            return True
        budget, free = vllm_compat.encoder_capacity(self.scheduler)
        return encoder_used + mine + theirs <= budget and mine + theirs <= free

    def new_blocks(self, request, num_tokens: int) -> int:
        """Blocks a request lacks to hold ``num_tokens`` (0 if it has them), over its KV cache
        groups: its (self-)attention groups, and an encoder-decoder request's cross-attention
        group, which holds its encoder positions from the step it starts in."""
        running = vllm_compat.is_running(request)
        total = 0
        for group, (size, cross) in enumerate(self.kv_groups):
            if cross:
                total += 0 if running else -(-vllm_compat.encoder_kv_tokens(self.scheduler, request) // size)
            else:
                held = vllm_compat.held_kv_blocks(self.scheduler, request, group) if running else 0
                total += max(0, -(-num_tokens // size) - held)
        return total
