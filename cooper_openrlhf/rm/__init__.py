"""VerifyRM: the reference-based reward model (model load/encode/export, hybrid annotation, BCE training).

Import from the submodules (`cooper_openrlhf.rm.model`, `.annotate`, `.bce_train`); this package imports nothing heavy.
"""
