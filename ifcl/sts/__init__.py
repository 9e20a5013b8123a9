"""STS: the evaluator (the Trainer's too), the tasks and their files, the encoders scored, the command line of
``evaluate_sts.py`` and the ``evaluate`` metric ``metric/sts_spearman``."""
