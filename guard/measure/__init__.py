"""The measure stage: what drives a vLLM engine and records what it measured.

``side.py`` is the engine-side interface; ``inprocess.py``, ``server.py`` and ``worker.py`` implement
it (``process.py``: the child processes the last two own); ``run.py`` is the one run stage over one
side (a plain check) or two (A/B); ``child.py`` runs one side in the child process a command
starts (``harness.py``).

Kept import-free: a baseline worker (``python -m guard.measure.worker``) runs in an environment
that has only vLLM's stack beside this checkout.
"""
