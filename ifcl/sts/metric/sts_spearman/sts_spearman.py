"""STS Spearman: the STS protocol's correlations of predicted similarities with gold scores, as an ``evaluate`` metric
that loads offline from the package (``evaluate.load(ifcl.STS_METRIC_PATH)``). The maths is
``ifcl.sts.evaluator.sts_correlations``, which ``STSEvaluator`` calls too.
"""

import datasets
import evaluate

from ifcl.objectives import objective_class
from ifcl.sts.evaluator import sts_correlations

_DESCRIPTION = """\
The STS (semantic textual similarity) protocol of SimCSE, IFCL, ConIsI, PCL and miCSE: one Spearman rank correlation
(and one Pearson correlation) over all sentence pairs of an STS set, between the similarity a model predicts for each
pair (the cosine of the two sentence embeddings) and the pair's gold score, both × 100. No regressor is trained.

The metric takes the similarities, not the embeddings; its figures are those of `ifcl.STSEvaluator` and of the
Trainer's `eval_<set>_spearman` / `eval_<set>_pearson` (the same function computes them).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `float`): the predicted similarity of each pair, e.g. the cosine of its two sentence
        embeddings. Only their order matters to Spearman.
    references (`list` of `float`): the gold score of each pair (e.g. 0–5 for STS-B), in the same order.
        At least 2 pairs.

Returns:
    spearman (`float`): Spearman's rank correlation × 100, between -100 and 100 (ties get average ranks).
    pearson (`float`): Pearson's correlation × 100, between -100 and 100.
    Both are NaN where they are undefined: every prediction the same, every reference the same, or a NaN input
    (scipy warns with `ConstantInputWarning` for a constant input).

Examples:

    >>> sts_spearman = evaluate.load("ifcl/sts/metric/sts_spearman")  # or evaluate.load(ifcl.STS_METRIC_PATH)
    >>> results = sts_spearman.compute(predictions=[0.81, 0.12, 0.55, 0.93, 0.40], references=[4.2, 0.5, 2.5, 3.8, 2.6])
    >>> print(results)
    {'spearman': 80.0, 'pearson': 94.55854949526447}
"""

# SimCSE's protocol and the IFCL paper, as the objective registry cites them.
_CITATION = "\n".join(objective_class(name).paper.citation for name in ("simcse", "ifcl")) + "\n"


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class StsSpearman(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            # float64: gold scores such as 3.8 keep their value (float32 would round them and move the figures).
            features=datasets.Features(
                {"predictions": datasets.Value("float64"), "references": datasets.Value("float64")}
            ),
            reference_urls=[
                "https://docs.scipy.org/doc/scipy/reference/generated/scipy.stats.spearmanr.html",
                "https://docs.scipy.org/doc/scipy/reference/generated/scipy.stats.pearsonr.html",
            ],
        )

    def _compute(self, predictions, references):
        return sts_correlations(predictions, references)
