"""Benchmarks and audits, run as scripts (``python benchmarks/<name>.py``).

A package only so that tests import the phase-retrieval attack as ``benchmarks.phase_retrieval_attack`` (under
pytest the repository root is on ``sys.path``, as it is for ``tests.conftest``).
"""
