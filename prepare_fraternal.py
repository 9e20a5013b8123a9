#!/usr/bin/env python
"""Translate a file of sentences into IFCL training pairs (``sentence<TAB>translation``): ``ifcl.translation``'s
command (installed as ``ifcl-prepare-fraternal``); ``--help`` lists its arguments."""

from ifcl.translation import main

if __name__ == "__main__":
    main()
