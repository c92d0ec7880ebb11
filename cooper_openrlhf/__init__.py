"""cooper-openrlhf: Cooper (arXiv 2508.05613) -- GRPO with a reward model that keeps learning -- on OpenRLHF."""

import logging
import warnings

__version__ = "0.1.0"


# Two messages every start printed that this package causes and no user can act on, silenced before the imports
# that emit them (the package is imported before any of its modules): torch imports `pynvml`, whose deprecated
# redirector package (pulled in beside nvidia-ml-py) warns on import; and bitsandbytes, imported through
# peft/transformers, logs at import that its optional CPU 4-bit kernels (the `kernels` package) are missing, which
# nothing here uses. Only these two messages: every other warning of those libraries still shows.
warnings.filterwarnings("ignore", message="The pynvml package is deprecated", category=FutureWarning)


class _DropMissingKernelsPackage(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "No module named 'kernels'" not in record.getMessage()


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_DropMissingKernelsPackage())
