"""Training layer: the PyTorch adapter over the layers below (issue 7, in progress).

Modules so far:

* ``_example`` -- the built-in example task: a small transformer language
  model on the documentation text that ships with CPython (no downloads).
* ``_checkpoint`` -- atomic checkpoints (temp file, fsync, rename) and resuming.
"""
