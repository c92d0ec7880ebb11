"""Verification: answer extraction, the math-verify rule verifier, its process pool, the LLM judge, metrics.

Import from the submodules (e.g. `cooper_openrlhf.verify.pool`); this package imports nothing heavy.
"""
