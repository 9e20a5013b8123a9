#!/usr/bin/env python
"""Evaluate a sentence encoder on STS sets (Spearman × 100): the command-line entry of ``ifcl.evaluate_sts``
(installed as ``ifcl-evaluate-sts``); ``python evaluate_sts.py --help`` lists its arguments."""

from ifcl.evaluate_sts import cli

if __name__ == "__main__":
    cli()
