"""cooper-openrlhf: Cooper (arXiv 2508.05613) -- GRPO with a reward model that keeps learning -- on OpenRLHF."""

__version__ = "0.1.0"
