"""The training objectives ``run_ifcl.py --objective`` chooses from, all run by the same ``IFCLTrainer``.

====== ================================================= =============================================
name   method                                            module
====== ================================================= =============================================
ifcl   Identical and Fraternal Twins (Xiao et al. 2023)   :mod:`objectives.ifcl`
simcse unsupervised SimCSE (Gao et al. 2021)               :mod:`objectives.simcse`
conisi ConIsI (Sun et al. 2023)                            :mod:`objectives.conisi`
pcl    Peer-Contrastive Learning (Wu et al. 2022)          :mod:`objectives.pcl`
micse  miCSE (Klein & Nabi 2023)                           :mod:`objectives.micse`
====== ================================================= =============================================

Only what training needs lives here: a published model embeds with ``modeling_ifcl.py`` alone, whatever the
objective it was trained with.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, fields, is_dataclass
from typing import Any

from configuration_ifcl import OBJECTIVES

from .base import Gather, Objective, ObjectiveOutput, no_gather, pad_features

# name -> (module, class); imported on first use.
OBJECTIVE_CLASSES: dict[str, tuple[str, str]] = {
    "ifcl": ("objectives.ifcl", "IFCLObjective"),
    "simcse": ("objectives.simcse", "SimCSEObjective"),
    "conisi": ("objectives.conisi", "ConIsIObjective"),
    "pcl": ("objectives.pcl", "PCLObjective"),
    "micse": ("objectives.micse", "MiCSEObjective"),
}
assert tuple(OBJECTIVE_CLASSES) == OBJECTIVES


def objective_class(name: str) -> type[Objective]:
    """The class of objective ``name``."""
    if name not in OBJECTIVE_CLASSES:
        raise ValueError(f"Unknown objective {name!r}; choose one of {', '.join(OBJECTIVE_CLASSES)}.")
    module, cls = OBJECTIVE_CLASSES[name]
    return getattr(importlib.import_module(module), cls)


def settings_classes() -> list[type]:
    """Every objective's settings dataclass (for ``HfArgumentParser``), in registry order."""
    classes = [objective_class(name).settings_class for name in OBJECTIVE_CLASSES]
    return [cls for cls in classes if cls is not None]


def settings_as_dict(settings: Any) -> dict[str, Any]:
    """A settings dataclass as the dict the model config stores (``IFCLConfig.objective_settings``)."""
    return asdict(settings) if is_dataclass(settings) else {}


def build_objective(model) -> Objective:
    """The objective ``model.config.objective`` names, with the settings stored in the config.

    Settings the stored dict lacks (a config written by an older version) take their defaults.
    """
    cls = objective_class(getattr(model.config, "objective", "ifcl"))
    settings = None
    if cls.settings_class is not None:
        stored = getattr(model.config, "objective_settings", None) or {}
        known = {f.name for f in fields(cls.settings_class)}
        settings = cls.settings_class(**{k: v for k, v in stored.items() if k in known})
    return cls(model, settings)


__all__ = [
    "OBJECTIVE_CLASSES",
    "Gather",
    "Objective",
    "ObjectiveOutput",
    "build_objective",
    "no_gather",
    "objective_class",
    "pad_features",
    "settings_as_dict",
    "settings_classes",
]
