#!/usr/bin/env python
"""Translate a file of sentences into IFCL training pairs (``sentence<TAB>translation``): the command-line entry of
``ifcl.translation`` (installed as ``ifcl-prepare-fraternal``); ``python prepare_fraternal.py --help`` lists its
arguments."""

from ifcl.translation import main

if __name__ == "__main__":
    main()
