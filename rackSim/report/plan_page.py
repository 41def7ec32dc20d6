"""The plan as one self-contained HTML page (jinja2; figures embedded as base64 PNG, no
scripts, no external resources), for the person who has to sign the order."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import pandas as pd
from markupsafe import Markup

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title }}</title>
<style>
 body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 78em; color: #222; }
 table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }
 th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }
 th { background: #f0f0f0; }
 td:first-child, th:first-child { text-align: left; }
 .note { background: #fff8e0; border-left: 4px solid #e0b000; padding: 0.5em 1em; }
 .miss { background: #fde8e8; border-left: 4px solid #c00; padding: 0.5em 1em; }
 figure { margin: 1em 0; }
 img { max-width: 100%; }
 .wide { overflow-x: auto; }
</style>
</head>
<body>
<h1>{{ title }}</h1>
<p>{{ question }}</p>
{% if missed %}<p class="miss" id="missed">{{ missed }}</p>{% endif %}
{% for note in notes %}<p class="note">{{ note }}</p>
{% endfor %}
<h2>Plans</h2>
<div class="wide">{{ plan_html }}</div>
<p>Headroom: (prediction - SLO) / SLO, positive is better; screen error: screen / DES - 1.
Cost per GPU-hour counts the whole racks bought against the GPUs in use.</p>
{% for fig in figures %}
<figure id="{{ fig.id }}">
<img alt="{{ fig.caption }}" src="data:image/png;base64,{{ fig.data }}">
<figcaption>{{ fig.caption }}</figcaption>
</figure>
{% endfor %}
<h2>Families and why they lost</h2>
<div class="wide">{{ families_html }}</div>
<h2>How the numbers were made</h2>
<ul>{% for line in method %}<li>{{ line }}</li>{% endfor %}</ul>
</body>
</html>
"""


@dataclass
class PlanPage:
    """What the page shows; `figures` maps a caption to PNG bytes."""

    title: str
    question: str
    plans: pd.DataFrame
    families: pd.DataFrame
    figures: dict[str, bytes] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    method: list[str] = field(default_factory=list)
    missed: str = ""


def _table(df: pd.DataFrame, table_id: str) -> str:
    return df.to_html(index=False, table_id=table_id, border=0, na_rep="",
                      float_format=lambda v: f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}")


def render_plan_page(page: PlanPage) -> str:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    figures = [{"id": f"figure-{i}", "caption": cap, "data": base64.b64encode(png).decode()}
               for i, (cap, png) in enumerate(page.figures.items())]
    return env.from_string(TEMPLATE).render(
        title=page.title, question=page.question, missed=page.missed, notes=page.notes,
        plan_html=Markup(_table(page.plans, "plans")),
        families_html=Markup(_table(page.families, "families")),
        figures=figures, method=page.method)


def write_plan_page(page: PlanPage, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_plan_page(page), encoding="utf-8")
    return path
