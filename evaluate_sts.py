#!/usr/bin/env python
"""Evaluate a sentence encoder on STS sets: the command line of ``ifcl.sts.command`` (``ifcl-evaluate-sts``)."""

from ifcl.sts.command import cli

if __name__ == "__main__":
    cli()
