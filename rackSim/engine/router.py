"""Routes each request to a prefill instance.

round_robin: in turn. least_loaded: fewest queued prompt tokens. session_affinity: the instance
that served the session before (first time: least loaded). prefix_affinity (cache-aware with
a balance threshold, as production routers do): among instances whose queue is within
BALANCE_REL of the shortest queue (or one step's token budget of it, whichever is more), the
one holding the longest cached prefix of the prompt; ties go to the shorter queue.
"""

from __future__ import annotations

from rackSim.engine.prefill import PrefillInstance
from rackSim.engine.request import Job

BALANCE_REL = 1.25  # ASSUMED: queue imbalance tolerated to keep a request on its cached prefix
POLICIES = ("round_robin", "least_loaded", "session_affinity", "prefix_affinity")


class Router:
    def __init__(self, policy: str, instances: list[PrefillInstance]):
        if policy not in POLICIES:
            raise ValueError(f"deployment.router: unknown policy '{policy}'; use one of {POLICIES}")
        self.policy, self.instances = policy, instances
        self._next = 0
        self._sticky: dict[int, PrefillInstance] = {}

    def _least_loaded(self) -> PrefillInstance:
        return min(self.instances, key=lambda p: (p.queued_tokens, p.index))

    def route(self, job: Job) -> PrefillInstance:
        if self.policy == "round_robin":
            inst = self.instances[self._next % len(self.instances)]
            self._next += 1
            return inst
        if self.policy == "least_loaded":
            return self._least_loaded()
        if self.policy == "session_affinity":
            key = job.inst.key_base
            inst = self._sticky.get(key)
            if inst is None:
                inst = self._sticky[key] = self._least_loaded()
            return inst
        shortest = min(p.queued_tokens for p in self.instances)
        return min((p for p in self.instances
                    if p.queued_tokens <= max(shortest * BALANCE_REL, shortest + p.step_tokens)),
                   key=lambda p: (p.estimated_uncached(job), p.queued_tokens, p.index))
