"""Typed errors of zerocomm.zero.

Configuration errors are also ``ValueError``\\ s and state errors ``RuntimeError``\\ s, so code that
catches the builtin kinds keeps working.  Messages name the rank where one is known, the object
(bucket, parameter, checkpoint file) and the offending value.
"""
from __future__ import annotations


class ZeroError(Exception):
    """Base class of every zerocomm.zero error."""


class ZeroConfigError(ZeroError, ValueError):
    """A configuration value (or a DeepSpeed key) that zerocomm.zero does not accept."""


class ZeroStateError(ZeroError, RuntimeError):
    """An operation came at the wrong time: a bucket filled twice, a step before its reductions, ..."""


class CheckpointError(ZeroError, RuntimeError):
    """A checkpoint cannot be written, read or matched to this model; the message names the file."""
