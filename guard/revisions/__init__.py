"""Revisions of a vLLM git repository, as ``guard pr`` measures them.

- ``git``: resolve revisions, list what a pull request changed, and which of those changes a CPU
  runner cannot measure (compiled code, dependencies);
- ``overlay``: one environment per revision, cached by the content hash of its ``vllm/`` tree:
  the locked engine stack with that revision's Python sources in front;
- ``functions``: the lines a pull request added inside a census function.
"""
