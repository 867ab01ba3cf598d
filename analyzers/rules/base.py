"""The rule base class: one small class per check, carrying its own docs and examples.

A rule declares handlers named after libcst node classes, like fixit/libcst visitors but
with the shared :class:`~analyzers.context.FileContext` passed in::

    class UnsafeTorchLoad(Rule):
        id = "TR601"
        ...
        def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
            if ctx.call_name(node) == "torch.load" and ...:
                self.report(node, "...")

``visit_X`` runs when the walk enters an ``X`` node, ``leave_X`` when it leaves it (after
all of its children), and ``end_file`` once after the walk. Rules never walk the tree
themselves; the engine walks it once for all rules. One instance is created per file, so
rules may keep per-file state on ``self``.
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Mapping, Optional, Sequence, Union

import libcst as cst

from analyzers.model import Category, Severity

if TYPE_CHECKING:
    from analyzers.context import FileContext


@dataclass(frozen=True)
class Valid:
    code: str
    requirements: Optional[str] = None  # a requirements.txt beside the example (rules that read version pins)
    select: tuple[str, ...] = ()  # the selection it runs under (a TorchFix code widens some rules: Rule.OPTIONS)


@dataclass(frozen=True)
class Invalid:
    """Code that must produce a finding of the rule.

    ``line`` (1-based, after dedent) pins where; ``message`` is a substring the message must
    contain (so messages naming the concrete object are tested); ``fixed`` is the whole file
    after applying the rule's fix, when the rule offers one; ``requirements`` is the text of a
    requirements.txt the example's repository has (for rules that depend on pinned versions).
    """

    code: str
    line: Optional[int] = None
    message: Optional[str] = None
    fixed: Optional[str] = None
    count: int = 1
    requirements: Optional[str] = None  # a requirements.txt beside the example (rules that read version pins)
    select: tuple[str, ...] = ()  # the selection it runs under (a TorchFix code widens some rules: Rule.OPTIONS)


Example = Union[str, Valid, Invalid]


@dataclass
class PendingFinding:
    node: cst.CSTNode
    message: str
    replacement: Optional[cst.CSTNode]  # a node replacing ``node`` (mechanical fix), or None
    severity: Optional[Severity]
    # other sites: (node, what happens there), or (line, what happens there) for sites known by line only
    related: tuple[tuple[Union[cst.CSTNode, int], str], ...] = ()
    safe: Optional[bool] = None  # None: the rule's ``fix_safety``
    pins: Optional[str] = None  # the library whose pinned releases the verdict rests on (the message names them)


REGISTRY: dict[str, type["Rule"]] = {}

# libcst node class name -> class, for resolving handler names like ``visit_Call``.
_NODE_CLASSES = {name: obj for name, obj in vars(cst).items() if isinstance(obj, type) and issubclass(obj, cst.CSTNode)}


class Rule:
    id: ClassVar[str]
    slug: ClassVar[str]
    category: ClassVar[Category]
    severity: ClassVar[Severity]
    #: which library the file must import for this rule to run: torch, sklearn or tensorflow
    requires: ClassVar[str] = "torch"
    #: text the source must contain for the rule to ever report (a DDP rule needs "Distributed..."), or a
    #: tuple of patterns that must all be found: rules whose hint is absent are not run on the file at
    #: all, which keeps specialised rules free elsewhere. A hint is a necessary condition on *this* file's
    #: text (what is reported is always a node of this file), never a guess about what is likely.
    source_hint: ClassVar[Union[None, "re.Pattern[str]", tuple["re.Pattern[str]", ...]]] = None
    #: short one-liner used in rule tables and comment headers
    summary: ClassVar[str]
    #: ruff-style docs: what it does / why is this bad / example / use instead
    what: ClassVar[str]
    why: ClassVar[str]
    example: ClassVar[str]
    fix_example: ClassVar[str]
    #: "safe": the fix keeps behaviour (a rename), `--fix` applies it; "unsafe": it changes what the
    #: program does (e.g. weights_only=True refuses some checkpoints), applied only with --unsafe-fixes
    fix_safety: ClassVar[str] = "safe"
    #: the library whose releases the verdict depends on (a removed or deprecated API): each message ends with
    #: the pin it read, or that none was found (``VersionFacts.assumption``); ``report(pins=...)`` per finding
    pinned_package: ClassVar[Optional[str]] = None
    #: a security weakness, not only a bug: SARIF gives it a security-severity, so code scanning ranks it
    #: among security alerts
    security: ClassVar[bool] = False
    #: purely syntactic, nothing inferred (a call of a removed API, a pickle opcode that imports a callable):
    #: with too few findings to measure, such a rule is stable unless a judged finding was wrong (levels.py)
    syntactic: ClassVar[bool] = False
    #: the only harm is speed (a GPU stall, a slower loader, an extra all-reduce): where the code never runs at
    #: scale (test code, a program on tiny synthetic data) there is nothing to gain, and the finding is not
    #: reported (``analyzers.levels.context_silences``)
    speed_only: ClassVar[bool] = False
    #: wider scopes a selection can turn on (name -> what it adds): a TorchFix user who selects a TOR code gets
    #: TorchFix's scope for it (``TorchFixCode.scope`` in analyzers.torchfix_map); findings only the wider scope
    #: makes are low severity. ``self.options`` holds the ones on for this run.
    OPTIONS: ClassVar[Mapping[str, str]] = {}
    options: frozenset[str] = frozenset()
    #: runs only when a selection names it (its id or slug, or a TorchFix code it covers), never through
    #: ``ALL``, an id prefix or a category: a check TorchFix users asked for that our default users do without
    opt_in: ClassVar[bool] = False
    VALID: ClassVar[list[Example]] = []
    INVALID: ClassVar[list[Example]] = []

    # Filled by __init_subclass__: node class -> handler method names
    _visit_handlers: ClassVar[dict[type, str]]
    _leave_handlers: ClassVar[dict[type, str]]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls._visit_handlers = {}
        cls._leave_handlers = {}
        for attr in dir(cls):
            for prefix, table in (("visit_", cls._visit_handlers), ("leave_", cls._leave_handlers)):
                if attr.startswith(prefix):
                    node_cls = _NODE_CLASSES.get(attr[len(prefix):])
                    if node_cls is None:
                        raise TypeError(f"{cls.__name__}.{attr}: no libcst node class {attr[len(prefix):]!r}")
                    table[node_cls] = attr
        if cls.fix_safety not in ("safe", "unsafe"):
            raise TypeError(f"{cls.__name__}.fix_safety must be 'safe' or 'unsafe', not {cls.fix_safety!r}")
        if getattr(cls, "id", None) is None:
            return  # abstract helper base
        for required in ("slug", "category", "severity", "summary", "what", "why", "example", "fix_example"):
            if not getattr(cls, required, None):
                raise TypeError(f"rule {cls.id} lacks {required}")
        if cls.id in REGISTRY and REGISTRY[cls.id] is not cls:
            raise TypeError(f"duplicate rule id {cls.id}: {REGISTRY[cls.id].__name__} and {cls.__name__}")
        REGISTRY[cls.id] = cls

    @classmethod
    def may_report_on(cls, source: str, options: frozenset[str] = frozenset()) -> bool:
        """False when the source lacks the text this rule needs to report anything (its ``source_hint``);
        a rule whose ``options`` widen what it needs overrides this."""
        hint = cls.source_hint
        if hint is None:
            return True
        if isinstance(hint, tuple):
            return all(pattern.search(source) for pattern in hint)
        return hint.search(source) is not None

    def __init__(self, ctx: "FileContext") -> None:
        self.ctx = ctx
        self.pending: list[PendingFinding] = []

    def report(self, node: cst.CSTNode, message: str, *, replacement: Optional[cst.CSTNode] = None,
               severity: Optional[Severity] = None,
               related: Sequence[tuple[Union[cst.CSTNode, int], str]] = (), safe: Optional[bool] = None,
               pins: Optional[str] = None) -> None:
        """Report ``node``. ``replacement`` is a node that replaces it as a mechanical fix (``safe``
        overrides the rule's ``fix_safety`` for this one fix); ``related`` are the other sites of the
        problem (a pull request that changes only one of them is still told); ``pins``: the library whose
        pinned releases this verdict assumed (default: the rule's ``pinned_package``)."""
        self.pending.append(PendingFinding(node, message, replacement, severity, tuple(related), safe,
                                           pins or self.pinned_package))

    def end_file(self, ctx: "FileContext") -> None:
        """Called once after the walk; override for whole-file checks."""

    @classmethod
    def _selection_docs(cls) -> str:
        """What opt-in and options mean for this rule, for its page; empty for most rules."""
        from analyzers.torchfix_map import torchfix_codes_for

        text = ""
        codes = ", ".join(f"`{e.code}`" for e in torchfix_codes_for(cls.id))
        if cls.opt_in:
            text += (f"Runs only when selected by name (`--select {cls.id}`)" +
                     (f" or by TorchFix code ({codes})" if codes else "") + "; `ALL` does not run it.\n\n")
        for option, what in cls.OPTIONS.items():
            widening = ", ".join(f"`{e.code}`" for e in torchfix_codes_for(cls.id, option))
            text += f"Selected through TorchFix ({widening}): {textwrap.dedent(what).strip()}\n\n"
        return text

    @classmethod
    def docs(cls) -> str:
        def block(text: str) -> str:
            return textwrap.dedent(text).strip("\n")

        from analyzers import levels

        return (
            f"# {cls.id} {cls.slug}\n\n"
            f"Category: {cls.category.value} · default severity: {levels.capped(cls.id, cls.severity).label}\n\n"
            f"Level: {levels.describe(cls.id)}\n\n"
            f"{cls._selection_docs()}"
            f"## What it does\n{block(cls.what)}\n\n"
            f"## Why is this bad?\n{block(cls.why)}\n\n"
            f"## Example\n```python\n{block(cls.example)}\n```\n\n"
            f"## Use instead\n```python\n{block(cls.fix_example)}\n```\n"
        )

