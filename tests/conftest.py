"""Shared fixtures: small validated scenarios built from the real Hydra tree, figures caught
before they are saved, and the hypothesis profiles: `quick` (default, what CI runs) and
`deep` (HYPOTHESIS_PROFILE=deep: the engine and fleet invariants over at least 1,000 generated
scenarios each; README, Tests)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from rackSim.config import RunConfig, compose_scenario

settings.register_profile("quick")
settings.register_profile("deep", max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


@pytest.fixture(scope="session")
def smoke_cfg() -> RunConfig:
    return compose_scenario(["experiment=smoke", "progress=false"])



@pytest.fixture
def caught_figures(monkeypatch):
    """`catch(module, saver)` replaces `module.saver` (a function given the figure first)
    so that the figures it would save are drawn, laid out as saved (`layout`: tight_layout
    first) and kept open for the test to read; returns the list they go into. They are
    closed after the test."""
    import matplotlib.pyplot as plt

    close = plt.close  # the saver caught may be plt.close itself
    figures = []

    def catch(module, saver: str, layout: bool = True) -> list:
        def keep(fig, *args, **kwargs):
            if layout:
                fig.tight_layout()
            fig.canvas.draw()
            figures.append(fig)
            return args[0] if args else b""

        monkeypatch.setattr(module, saver, keep)
        return figures

    yield catch
    for fig in figures:
        close(fig)
