"""pytest-hpcnet suite (a package so that test modules of different suites may share names)."""
