"""The errors of `remat.torch`: each names the region, op, module, input or parameter at fault."""

from __future__ import annotations


class RematTorchError(Exception):
    """Base class of every error `remat.torch` raises."""


class CaptureError(RematTorchError):
    """The model cannot be captured as asked (a region that runs twice, two devices, a bad loss)."""


class PlanMismatchError(RematTorchError):
    """A plan made for another model, other shapes or other regions."""


class OpMismatchError(RematTorchError):
    """A planned region ran an op sequence that differs from the captured one."""


class AppliedError(RematTorchError):
    """What cannot be done to a model while a plan is applied to it (copying it, pickling it)."""


class MeasureError(RematTorchError):
    """A measurement asked with bad settings, or steps that cannot be compared."""
