"""Routes each request to a prefill (or colocated) instance of a rack.

round_robin: in turn. least_loaded: fewest queued prompt tokens. session_affinity: the instance
that served the session before (first time: least loaded). prefix_affinity: least work, the
instance where queued work plus this request's uncached tokens *there* is smallest, so a
cached prefix keeps its session unless the queue elsewhere is shorter by more than the work
of recomputing that prefix.

Ties (equal queued tokens, or equal work) go to the instance holding the fewest requests
(`requests_held`: waiting, prefilling, and on a colocated instance decoding), then to the one
sent the fewest so far, then to the lowest index. At light load every queue is empty when a
session starts, so the tie-break places the sessions. vLLM balances its data-parallel engines
on their running and waiting requests (docs/serving/data_parallel_deployment.md in vLLM); a
prefill instance with nothing queued holds none, so there the requests sent decide. Taken
by the lowest index, a rack of nine colocated instances ended up with 76 and 78 sessions on
the first two and 24-46 on the others; taken by requests sent alone, colocated instances
whose long steps slowed their sessions (so that they sent fewer requests) drew more sessions
and slowed further: at 267 agents on nine GB200 DEP8 instances, 28 to 52 agents an instance
and mean occupancies of 6 to 17 requests (now 35-44 and 8-12).
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
        #: requests sent to each instance so far (a tie-break)
        self.sent: dict[PrefillInstance, int] = dict.fromkeys(instances, 0)

    def _tie(self, p: PrefillInstance) -> tuple[int, int]:
        """What breaks a tie between instances of equal load, smallest first (the module
        docstring says why)."""
        return p.requests_held, self.sent[p]

    def _least_loaded(self) -> PrefillInstance:
        tie = self._tie
        return min(self.instances, key=lambda p: (p.queued_tokens, tie(p), p.index))

    def home(self, key: int, inst: PrefillInstance) -> None:
        """Primer: session `key`'s prefix was made resident on `inst`; under session affinity
        the session starts there."""
        if self.policy == "session_affinity":
            self._sticky[key] = inst

    def route(self, job: Job) -> tuple[PrefillInstance, int | None]:
        """The instance for `job`, and its uncached tokens there when the policy computed them."""
        uncached = None
        if self.policy == "round_robin":
            inst = self.instances[self._next % len(self.instances)]
            self._next += 1
        elif self.policy == "least_loaded":
            inst = self._least_loaded()
        elif self.policy == "session_affinity":
            key = job.inst.key_base
            inst = self._sticky.get(key)
            if inst is None:
                inst = self._sticky[key] = self._least_loaded()
        else:
            inst, uncached = self._least_work(job)
        self.sent[inst] += 1
        return inst, uncached

    def _least_work(self, job: Job) -> tuple[PrefillInstance, int]:
        """Branch and bound: uncached work is >= 1 token, so an instance whose queue alone
        reaches the best total so far cannot win (nor tie) and its cache is not consulted."""
        best, best_total, best_uncached = None, None, 0
        # a stable sort of the index-ordered list: the order of (queued_tokens, index)
        for p in sorted(self._by_index, key=_queued):
            if best_total is not None and p.queued_tokens >= best_total:
                break
            uncached = p.estimated_uncached(job)
            total = p.queued_tokens + uncached
            if best_total is None or total < best_total or (
                    total == best_total and self._tie(p) < self._tie(best)):
                best, best_total, best_uncached = p, total, uncached
        return best, best_uncached
