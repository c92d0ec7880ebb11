"""`python tests/serve_pausing_save.py SERVE_FLAGS...`: `cli.serve`, except that one checkpoint save stops half-way.

A test that kills the service during a save must land the kill at a known moment, not at a guessed time. This
entry point wraps `torch.save` (what DeepSpeed's checkpoint engine writes every file with): at the write of the
optimizer states of the `COOPER_TEST_PAUSE_SAVE`-th checkpoint (1-based) it writes the file's path to
`COOPER_TEST_PAUSE_MARKER` and sleeps instead of writing, so the model states of that checkpoint are on disk and
its optimizer states are not: a save caught in the middle. The test then sends kill -9. Nothing of the service is
changed: the moment is DeepSpeed's own order of writes, the same for any checkpoint protocol on top of it.
"""

import os
import runpy
import sys
import time

import torch

PAUSE_AT = int(os.environ["COOPER_TEST_PAUSE_SAVE"])
MARKER = os.environ["COOPER_TEST_PAUSE_MARKER"]
_real_save = torch.save
_optimizer_writes = 0


def _pausing_save(obj, f, *args, **kwargs):
    global _optimizer_writes
    if isinstance(f, (str, os.PathLike)) and str(f).endswith("optim_states.pt"):
        _optimizer_writes += 1
        if _optimizer_writes == PAUSE_AT:
            with open(MARKER, "w", encoding="utf-8") as handle:
                handle.write(str(f))
            while True:  # until the test's kill -9
                time.sleep(60)
    return _real_save(obj, f, *args, **kwargs)


if __name__ == "__main__":
    torch.save = _pausing_save
    sys.argv = ["cooper_openrlhf.cli.serve", *sys.argv[1:]]
    runpy.run_module("cooper_openrlhf.cli.serve", run_name="__main__", alter_sys=True)
