"""The training objectives ``run_ifcl.py --objective`` chooses from, all run by the same ``IFCLTrainer``.

Each objective is a module here (``ifcl``, ``simcse``, ``conisi``, ``pcl``, ``micse``) whose class carries its name,
its paper and its loss terms; :data:`OBJECTIVES` registers them, and everything else reads them from there.

Only what training needs lives here: a published model embeds with ``modeling_ifcl.py`` alone, whatever the
objective it was trained with.
"""

from __future__ import annotations

from .base import Objective, ObjectiveOutput, fit_model, pad_features, settings_as_dict, unwrap_model
from .conisi import ConIsIObjective
from .ifcl import IFCLObjective
from .micse import MiCSEObjective
from .pcl import PCLObjective
from .simcse import SimCSEObjective

DEFAULT_OBJECTIVE = "ifcl"
# The one registry: ``--objective`` name -> class. Each class carries its paper, its loss terms and its settings;
# the config's valid names, the command line's choices, the model card and the training-curve plot read them here.
OBJECTIVES: dict[str, type[Objective]] = {
    cls.name: cls for cls in (IFCLObjective, SimCSEObjective, ConIsIObjective, PCLObjective, MiCSEObjective)
}


def objective_class(name: str) -> type[Objective]:
    """The class of objective ``name``."""
    if name not in OBJECTIVES:
        raise ValueError(f"Unknown objective {name!r}; choose one of {', '.join(OBJECTIVES)}.")
    return OBJECTIVES[name]


def settings_classes() -> list[type]:
    """Every objective's settings dataclass (for ``HfArgumentParser``), in registry order."""
    classes = [cls.settings_class for cls in OBJECTIVES.values()]
    return [cls for cls in classes if cls is not None]


def build_objective(model) -> Objective:
    """The objective ``model.config.objective`` names (None: IFCL), with its settings as the config stores them
    (``Objective.stored_settings``: a peer's under ``objective_settings``, IFCL's in the config's own fields); its
    :meth:`~Objective.prepare` fits the model to it when training starts."""
    cls = objective_class(getattr(model.config, "objective", None) or DEFAULT_OBJECTIVE)
    return cls(model, cls.stored_settings(model.config))


__all__ = [
    "DEFAULT_OBJECTIVE",
    "OBJECTIVES",
    "Objective",
    "ObjectiveOutput",
    "build_objective",
    "fit_model",
    "objective_class",
    "pad_features",
    "settings_as_dict",
    "settings_classes",
    "unwrap_model",
]
