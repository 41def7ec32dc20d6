"""Calibration profiles: fitted parameter values with their provenance and fit quality.

A profile is a YAML file under `calibration/` written by `racksim-calibrate`. Model code never
holds a fitted number; it reads every parameter from a `Profile`.

Layout::

    name, hardware, model, created_by
    constants:  {name: {value, source}}           # facts read from a source, not fitted
    params:     {name: {value, unit, fitted_to, source}}
    settings:   {name: value}                      # toggles (prefill optimisations, dispatch)
    residuals:  [{figure, quantity, published, predicted, error}]
    kernel_fit: {...}                              # fit quality against kernel tables
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rackSim.config.errors import ProfileInputError, read_yaml_mapping


class ProfileError(KeyError):
    """A parameter the model needs is missing from the profile."""


@dataclass
class Profile:
    """Parameter values (floats) plus everything needed to trace where each came from."""

    name: str
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    constants: dict[str, dict[str, Any]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    residuals: list[dict[str, Any]] = field(default_factory=list)
    kernel_fit: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    #: where it was read from, as messages name it ('perf.profile calibration/x.yaml'; empty
    #: for a profile built in memory); not part of the file
    origin: str = field(default="", compare=False)

    def value(self, key: str) -> float:
        """A fitted parameter or a constant, as float."""
        if key in self.params:
            return float(self.params[key]["value"])
        if key in self.constants:
            return float(self.constants[key]["value"])
        raise ProfileError(f"profile '{self.name}' has no parameter '{key}'")

    def require_model(self, model: str) -> None:
        """Refuse to price `model` (a model spec's `name`) with a profile fitted for another
        model (its `model` field): its constants are that model's shapes and its speeds that
        model's kernels, so some parameters are missing and the rest price the wrong layers.
        The message names where the profile came from (`origin`)."""
        fitted = self.meta.get("model")
        if fitted is None or str(fitted) == model:
            return
        on = f" on {self.meta['hardware']}" if self.meta.get("hardware") else ""
        raise ProfileInputError(
            f"{self.origin or 'a profile'}: profile '{self.name}' was fitted for model "
            f"{fitted}{on}, not for {model}; give {model}'s profile "
            "(calibration/<hardware>__<model>.yaml, fitted by `racksim-calibrate profile "
            "--model MODEL --hardware HARDWARE`), or run the model the profile is for")

    def setting(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)

    def set_param(self, key: str, value: float, unit: str, fitted_to: list[str] | str,
                  source: str) -> None:
        self.params[key] = {"value": float(value), "unit": unit,
                            "fitted_to": fitted_to, "source": source}

    def set_constant(self, key: str, value: float, source: str) -> None:
        self.constants[key] = {"value": float(value), "source": source}

    def with_values(self, values: dict[str, float]) -> Profile:
        """A copy with some parameter values replaced (used while fitting)."""
        params = {k: dict(v) for k, v in self.params.items()}
        for k, v in values.items():
            params.setdefault(k, {"unit": "", "fitted_to": [], "source": "fit in progress"})
            params[k]["value"] = float(v)
        return Profile(self.name, params, dict(self.constants), dict(self.settings),
                       list(self.residuals), dict(self.kernel_fit), dict(self.meta),
                       self.origin)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.meta, "constants": self.constants,
                "params": self.params, "settings": self.settings,
                "residuals": self.residuals, "kernel_fit": self.kernel_fit}

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(yaml.safe_dump(_plain(self.to_dict()), sort_keys=False,
                                             width=100))

    @classmethod
    def load(cls, path: str | Path, label: str = "perf.profile") -> Profile:
        """Read a profile; ProfileInputError names `label` (the key or flag that gave
        `path`), the file, the line or field, and the fix."""
        data = read_profile_yaml(path, label)
        for key in ("name", "params"):
            if key not in data:
                raise ProfileInputError(
                    f"{label} {path}: no '{key}' field, so this is not a calibration "
                    f"profile; point {label} at a file `racksim-calibrate` wrote "
                    "(calibration/*.yaml)")
        if not isinstance(data["params"], dict):
            raise ProfileInputError(f"{label} {path}: field 'params' must be a mapping "
                                    "of parameter name to {value, unit, fitted_to, source}")
        known = {"name", "constants", "params", "settings", "residuals", "kernel_fit"}
        return cls(name=data["name"], params=data.get("params") or {},
                   constants=data.get("constants") or {}, settings=data.get("settings") or {},
                   residuals=data.get("residuals") or [], kernel_fit=data.get("kernel_fit") or {},
                   meta={k: v for k, v in data.items() if k not in known},
                   origin=f"{label} {path}")


def read_profile_yaml(path: str | Path, label: str = "perf.profile") -> dict[str, Any]:
    """The mapping in a profile YAML file; ProfileInputError (`label`, file, line) when it
    cannot be read, is not YAML, or is not a mapping."""
    return read_yaml_mapping(path, label, ProfileInputError,
                             "profile fields (a file `racksim-calibrate` wrote)")


def _plain(obj: Any) -> Any:
    """numpy scalars and tuples -> plain YAML types."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, str):
        return obj.item()
    return obj  # floats keep full precision so residuals are reproducible from the file
