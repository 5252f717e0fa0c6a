"""Kernel-side drivers, one module per notebook: harness code that builds a learner's
module, loads the grader's weights into it by name, calls it and hands back tensors.
An exercise names one as ``"<module>.<function>"`` (see ``coursekit.probe.get_driver``).
They hold no reference and no secret."""
