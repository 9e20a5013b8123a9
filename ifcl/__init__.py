"""IFCL: Identical and Fraternal Twins contrastive learning of sentence encoders, the Hugging Face way.

``from ifcl import IFCLConfig, IFCLModel, IFCLSettings, IFCLTrainer, STSEvaluator`` (and ``IFCLLoss``, ``CachedIFCLLoss`` when
sentence-transformers is installed). ``IFCLModel.from_pretrained(folder)`` loads a saved IFCL model with this
package's classes, no remote code run. Importing the package registers the config and model with ``AutoConfig`` and
``AutoModel`` under the model type ``ifcl`` (for ``AutoModel.from_config``).
"""

from __future__ import annotations

import os
from typing import Any

from transformers import AutoConfig, AutoModel

from configuration_ifcl import IFCLConfig, IFCLSettings, SharedSettings
from ifcl.model import IFCLModel
from ifcl.sts.evaluator import STSEvaluator

__version__ = "0.2.0"
__all__ = [
    "CachedIFCLLoss",
    "IFCLConfig",
    "IFCLLoss",
    "IFCLModel",
    "IFCLSettings",
    "IFCLTrainer",
    "STSEvaluator",
    "STS_METRIC_PATH",
    "SharedSettings",
    "__version__",
]

# The ``evaluate`` metric of the STS protocol: ``evaluate.load(ifcl.STS_METRIC_PATH)``.
STS_METRIC_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sts", "metric", "sts_spearman")

AutoConfig.register(IFCLConfig.model_type, IFCLConfig, exist_ok=True)
AutoModel.register(IFCLConfig, IFCLModel, exist_ok=True)


def __getattr__(name: str) -> Any:
    """``IFCLTrainer`` on first use (it imports this package's modules, which import the package); ``IFCLLoss`` and
    ``CachedIFCLLoss`` import sentence-transformers, an optional extra: only when asked for."""
    if name == "IFCLTrainer":
        # trainer_ifcl imports this package's modules, which import the package: loaded when first asked for
        from trainer_ifcl import IFCLTrainer

        return IFCLTrainer
    if name in ("IFCLLoss", "CachedIFCLLoss"):
        # sentence-transformers is an optional extra: imported only when its losses are asked for
        from ifcl import sentence_transformers_loss

        return getattr(sentence_transformers_loss, name)
    raise AttributeError(f"module 'ifcl' has no attribute {name!r}")
