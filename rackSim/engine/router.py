"""Routes each request to a prefill instance.

round_robin: in turn. least_loaded: fewest queued prompt tokens. session_affinity: the instance
that served the session before (first time: least loaded). prefix_affinity: least work, the
instance where queued work plus this request's uncached tokens *there* is smallest, so a
cached prefix keeps its session unless the queue elsewhere is shorter by more than the work
of recomputing that prefix.
"""

from __future__ import annotations

from operator import attrgetter

from rackSim.engine.prefill import PrefillInstance
from rackSim.engine.request import Job

_queued = attrgetter("queued_tokens")

POLICIES = ("round_robin", "least_loaded", "session_affinity", "prefix_affinity")


class Router:
    def __init__(self, policy: str, instances: list[PrefillInstance]):
        if policy not in POLICIES:
            raise ValueError(f"deployment.router: unknown policy '{policy}'; use one of {POLICIES}")
        self.policy, self.instances = policy, instances
        self._next = 0
        self._sticky: dict[int, PrefillInstance] = {}
        self._by_index = sorted(instances, key=lambda p: p.index)

    def _least_loaded(self) -> PrefillInstance:
        return min(self.instances, key=lambda p: (p.queued_tokens, p.index))

    def route(self, job: Job) -> tuple[PrefillInstance, int | None]:
        """The instance for `job`, and its uncached tokens there when the policy computed them."""
        if self.policy == "round_robin":
            inst = self.instances[self._next % len(self.instances)]
            self._next += 1
            return inst, None
        if self.policy == "least_loaded":
            return self._least_loaded(), None
        if self.policy == "session_affinity":
            key = job.inst.key_base
            inst = self._sticky.get(key)
            if inst is None:
                inst = self._sticky[key] = self._least_loaded()
            return inst, None
        return self._least_work(job)

    def _least_work(self, job: Job) -> tuple[PrefillInstance, int]:
        """Branch and bound: uncached work is >= 1 token, so an instance whose queue alone
        reaches the best total so far cannot win and its cache is not consulted."""
        best, best_total, best_uncached = None, None, 0
        # a stable sort of the index-ordered list: the order of (queued_tokens, index)
        for p in sorted(self._by_index, key=_queued):
            if best_total is not None and p.queued_tokens >= best_total:
                break
            uncached = p.estimated_uncached(job)
            total = p.queued_tokens + uncached
            if best_total is None or total < best_total:
                best, best_total, best_uncached = p, total, uncached
        return best, best_uncached
