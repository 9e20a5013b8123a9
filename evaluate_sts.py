#!/usr/bin/env python
"""Evaluate a sentence encoder on STS sets: the command line of ``ifcl.evaluate_sts`` (``ifcl-evaluate-sts``)."""

from ifcl.evaluate_sts import cli

if __name__ == "__main__":
    cli()
