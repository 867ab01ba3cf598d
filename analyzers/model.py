"""The values the engine produces: severities, categories, findings, fixes and per-file errors."""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Optional


class Severity(enum.IntEnum):
    """Ordered so that ``Severity.HIGH > Severity.MEDIUM`` reads naturally."""

    LOW = 1
    MEDIUM = 2
    HIGH = 3
    CRITICAL = 4

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: "str | Severity") -> "Severity":
        if isinstance(value, Severity):
            return value
        try:
            return cls[str(value).strip().upper()]
        except KeyError:
            choices = ", ".join(s.label for s in cls)
            raise ValueError(f"unknown severity {value!r} (choose one of {choices})") from None


class Category(str, enum.Enum):
    TRAINING = "training-loop"
    INFERENCE = "inference"
    ARCHITECTURE = "architecture"
    NUMERICS = "numerics"
    AUTOGRAD = "autograd"
    SECURITY = "serialization"
    DEVICE = "device-performance"
    DEPRECATION = "mixed-precision-deprecation"
    REPRODUCIBILITY = "reproducibility"
    DATA_LEAKAGE = "data-leakage"
    DATA_PIPELINE = "data-pipeline"

    @property
    def title(self) -> str:
        return {
            "training-loop": "Training loop",
            "inference": "Inference",
            "architecture": "Architecture",
            "numerics": "Numerics",
            "autograd": "Autograd",
            "serialization": "Serialization & security",
            "device-performance": "Device & performance",
            "mixed-precision-deprecation": "Mixed precision & deprecations",
            "reproducibility": "Reproducibility",
            "data-leakage": "Data leakage",
            "data-pipeline": "Data pipeline",
        }[self.value]

    @property
    def id_prefixes(self) -> tuple[str, ...]:
        """The rule ids this category owns: a rule's id starts with one of them (TR9xx is shared by three)."""
        return {
            "training-loop": ("TR1",),
            "inference": ("TR2",),
            "architecture": ("TR3",),
            "numerics": ("TR4",),
            "autograd": ("TR5",),
            "serialization": ("TR6",),
            "device-performance": ("TR7",),
            "mixed-precision-deprecation": ("TR8",),
            "reproducibility": ("TR90",),
            "data-leakage": ("TR95", "TR97"),
            "data-pipeline": ("TR96",),
        }[self.value]

    @property
    def package(self) -> str:
        """The folder under analyzers/rules/ that holds this category's rules, one module each."""
        return self.value.replace("-", "_")


@dataclass(frozen=True)
class Fix:
    """Replace source lines ``start_line..end_line`` (1-based, inclusive) with ``replacement``.

    Whole lines, so the fix renders directly as a GitHub committable suggestion. ``safe``: the fix
    keeps the program's behaviour (a rename); ``--fix`` applies unsafe ones only with ``--unsafe-fixes``.
    """

    start_line: int
    end_line: int
    replacement: str
    safe: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        return "".join(lines[: self.start_line - 1]) + self.replacement + "".join(lines[self.end_line:])


@dataclass(frozen=True)
class Location:
    """Another site of a finding: where the problem is set up (``forward``'s softmax for a loss call, the
    split a leaking fit comes before). Same file as the finding."""

    line: int
    column: int
    end_line: int
    end_column: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    rule: str
    slug: str
    category: str
    severity: Severity
    message: str
    fix: Optional[Fix] = None
    cell: Optional[int] = None  # notebook cell number (1-based) when the file is a .ipynb
    related: tuple[Location, ...] = ()  # the other sites that matter, in the same file
    preview: bool = False  # the rule is at the preview level (analyzers.levels): shown, never fails a check
    # why the severity is below the rule's, from the file's role ("lowered: test code"; analyzers.levels)
    context: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "rule": self.rule,
            "slug": self.slug,
            "category": self.category,
            "severity": self.severity.label,
            "message": self.message,
            "fix": self.fix.to_dict() if self.fix else None,
            "related": [r.to_dict() for r in self.related],
        }
        if self.cell is not None:
            data["cell"] = self.cell
        if self.preview:
            data["preview"] = True
        if self.context:
            data["context"] = self.context
        return data

    @property
    def sort_key(self) -> tuple:
        return (self.path, self.cell or 0, self.line, self.column, self.rule)


@dataclass(frozen=True)
class FileError:
    """Something that stopped (part of) one file from being analyzed; the run goes on."""

    path: str
    kind: str  # syntax-error | decode-error | binary-file | too-large | rule-error | read-error | notebook-error
    #            | unknown-codec (a note: the file was read and analyzed)
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def unanalyzed(self) -> bool:
        """Whether the file went unanalyzed: a crashing rule is our bug, not the file's; a note is no failure."""
        return self.kind not in ("rule-error", "unknown-codec")


@dataclass
class FileResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    cached: bool = field(default=False, compare=False)  # came from the results cache (analyzers/cache.py)
    # What comments in the code silenced (``# noqa``, ``# torchreview: ignore``), listed so a reviewer sees it;
    # ``skipped_by_comment``: a ``# torchreview: skip-file`` comment, so nothing was analyzed.
    suppressed: list[Finding] = field(default_factory=list)
    skipped_by_comment: bool = False
