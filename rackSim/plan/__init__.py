"""The planner: demand + SLOs + hardware options + prices in, the cheapest fleets out.

Stage 1 (`screen`) prices every candidate fleet with `perf/` step models and queueing bounds,
no event loop; stage 2 (`confirm`) simulates the best through the Hydra launchers; `choose`
ranks and explains; `command` runs it all for `racksim-plan`. docs/planner.md.
"""
