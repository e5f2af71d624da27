"""Engines behind the public API (see DESIGN.md, "Layers").

Importing this package does not import MPI; ``rabit_py.api.init`` imports the
engine it needs.
"""
