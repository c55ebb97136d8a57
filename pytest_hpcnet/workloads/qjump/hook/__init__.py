"""Not imported as a package: ``hpcnet qjump run`` puts this directory first on PYTHONPATH so that
Python programs it starts import ``sitecustomize`` from here (see that module)."""
