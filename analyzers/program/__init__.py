"""The program model: what the rules ask about the code instead of resolving names themselves.

Each question is answered once per file, lazily (most files never ask most questions), from the tree the
engine already parsed:

- :mod:`.flow`: what happens to a value inside a function — is a parameter mutated or stored, which values
  reach a parameter from the call sites in the file;
- :mod:`.roles`: what role a piece of code plays — a compatibility fallback, a weights-only load context —
  and which checkpoints the program writes (and with what payload) before it loads them back;
- :mod:`.ranks`: which code runs on every process of a distributed job and which on some only;
- :mod:`.builds`, :mod:`.graphs`, :mod:`.data`: which module an expression builds, which values carry an
  autograd graph, what a data set's transform does and whether it lives in memory.
"""
from analyzers.program.flow import call_site_values, mutated_names, stored_attributes
from analyzers.program.roles import CheckpointWrites, Payload, in_compat_fallback

__all__ = ["CheckpointWrites", "Payload", "call_site_values", "in_compat_fallback", "mutated_names",
           "stored_attributes"]
