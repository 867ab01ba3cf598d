"""``torchreview lsp``: the findings of ``torchreview check`` in an editor, over the Language Server Protocol.

Diagnostics are published when a Python document is opened or saved, and after edits once typing
pauses (``--debounce``); a mechanical fix is offered as a quick fix that replaces the fix's lines (and removes
an import the fix leaves unused). The
configuration is the one ``torchreview check`` would use for the file (the nearest config file), and
the repository index is the CLI's, so a class imported from ``model.py`` is understood the same way.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from analyzers.config import Config, ConfigError, find_config
from analyzers.engine import analyze_text_bounded
from analyzers.freed_imports import with_freed_imports
from analyzers.model import FileError, FileResult, Finding, Fix, Severity
from analyzers.program.modules import index_for

log = logging.getLogger("torchreview.lsp")

SOURCE = "torchreview"
UNFINISHED = ("timeout", "parser-crash")  # analyzers.isolation's kinds: the file was not analyzed to the end
SEVERITY = {
    Severity.CRITICAL: types.DiagnosticSeverity.Error,
    Severity.HIGH: types.DiagnosticSeverity.Error,
    Severity.MEDIUM: types.DiagnosticSeverity.Warning,
    Severity.LOW: types.DiagnosticSeverity.Information,
}


@dataclass
class Analysis:
    """One document version's findings, kept for the code actions asked about it."""

    version: Optional[int]
    text: str
    findings: list[Finding]
    # the analysis could not finish (over the time or memory limit): said on the file, not silently empty
    unfinished: list[FileError] = field(default_factory=list)


class TorchreviewServer(LanguageServer):
    def __init__(self, debounce: float = 0.3) -> None:
        from analyzers.output import tool_version

        super().__init__("torchreview", tool_version(), text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.debounce = debounce
        self.analyses: dict[str, Analysis] = {}
        self.pending: dict[str, asyncio.TimerHandle] = {}
        self.generation: dict[str, int] = {}  # a newer request for a document makes older results stale
        self.config_problems: set[str] = set()

    # ---- analysis --------------------------------------------------------------------------
    def config_for(self, path: Optional[str]) -> Config:
        start = Path(path).parent if path else Path.cwd()
        try:
            return find_config(start)
        except ConfigError as exc:  # say it once per problem, analyze with the defaults meanwhile
            message = str(exc)
            if message not in self.config_problems:
                self.config_problems.add(message)
                self.window_show_message(types.ShowMessageParams(
                    types.MessageType.Error, f"torchreview: invalid configuration, using the defaults: {message}"))
            return Config()

    def path_of(self, uri: str) -> Optional[str]:
        return to_fs_path(uri) if uri.startswith("file:") else None

    def analyze_now(self, uri: str, text: Optional[str] = None, version: Optional[int] = None,
                    config: Optional[Config] = None) -> Analysis:
        """Analyze the document's text (the current one unless a snapshot is given)."""
        if text is None:
            document = self.workspace.get_text_document(uri)
            text, version = document.source, document.version
        path = self.path_of(uri)
        config = config or self.config_for(path)
        display = path or uri
        repository = index_for(Path(path)) if path else None
        if not display.endswith(".py"):
            display += ".py"  # an unsaved buffer of Python: analyzed as a script
        # in a forked child bounded by config.file_timeout: no file (or rule bug) can hang the editor's server
        result: FileResult = analyze_text_bounded(text, display, config, repository=repository)
        return Analysis(version, text, result.findings, [e for e in result.errors if e.kind in UNFINISHED])

    async def refresh(self, uri: str) -> None:
        generation = self.generation[uri] = self.generation.get(uri, 0) + 1
        document = self.workspace.get_text_document(uri)
        text, version = document.source, document.version  # a snapshot: edits go on arriving meanwhile
        config = self.config_for(self.path_of(uri))  # here: it may message the client
        try:
            # a thread: a large file must not stop the server from reading the next message
            analysis = await asyncio.to_thread(self.analyze_now, uri, text, version, config)
        except Exception:  # noqa: BLE001 - a crash in one analysis must not take the server down
            log.exception("analysis of %s failed", uri)
            return
        if self.generation.get(uri) != generation or uri not in self.workspace.text_documents:
            return  # edited again (or closed) meanwhile: the newer run publishes
        self.analyses[uri] = analysis
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
            uri=uri, version=analysis.version, diagnostics=[self.diagnostic(uri, analysis, f) for f in analysis.findings]
            + [self.unfinished_diagnostic(e) for e in analysis.unfinished]))

    def schedule(self, uri: str, delay: float) -> None:
        timer = self.pending.pop(uri, None)
        if timer is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        if delay <= 0:
            loop.create_task(self.refresh(uri))
            return

        def fire() -> None:
            self.pending.pop(uri, None)
            loop.create_task(self.refresh(uri))

        self.pending[uri] = loop.call_later(delay, fire)

    # ---- LSP shapes ------------------------------------------------------------------------
    def to_range(self, uri: str, lines: list[str], line: int, column: int, end_line: int, end_column: int):
        codec = self.workspace.get_text_document(uri).position_codec
        return codec.range_to_client_units(lines, types.Range(
            start=types.Position(line=line - 1, character=column - 1),
            end=types.Position(line=end_line - 1, character=end_column - 1)))

    def diagnostic(self, uri: str, analysis: Analysis, finding: Finding) -> types.Diagnostic:
        lines = analysis.text.splitlines(keepends=True)
        return types.Diagnostic(
            range=self.to_range(uri, lines, finding.line, finding.column, finding.end_line, finding.end_column),
            severity=SEVERITY[finding.severity],
            code=finding.rule,
            source=SOURCE,
            message=f"{finding.slug}: {finding.message}",
            data={"fix": finding.fix is not None},
        )

    @staticmethod
    def unfinished_diagnostic(error: FileError) -> types.Diagnostic:
        return types.Diagnostic(range=types.Range(start=types.Position(line=0, character=0),
                                                  end=types.Position(line=0, character=0)),
                                severity=types.DiagnosticSeverity.Warning, code=error.kind, source=SOURCE,
                                message=f"not analyzed: {error.message}")

    def line_edit(self, uri: str, text: str, fix: Fix) -> types.TextEdit:
        """A fix replaces whole lines: from the start of its first line to the start of the line after it."""
        lines = text.splitlines(keepends=True)
        replacement = fix.replacement
        if fix.end_line >= len(lines) and lines and not lines[-1].endswith(("\n", "\r")):
            # the last line has no newline: end on it, and do not add one
            end = self.to_range(uri, lines, fix.end_line, len(lines[-1]) + 1, fix.end_line, len(lines[-1]) + 1).end
            replacement = replacement.rstrip("\r\n")
        else:
            end = types.Position(line=fix.end_line, character=0)
        return types.TextEdit(range=types.Range(start=types.Position(line=fix.start_line - 1, character=0), end=end),
                              new_text=replacement)

    def fix_lines(self, uri: str, analysis: Analysis, finding: Finding) -> list[Fix]:
        """The finding's fix, and the removal of the imports it leaves unused (``Variable(x)`` -> ``x`` frees
        ``from torch.autograd import Variable``), as line edits of the document as it is."""
        return with_freed_imports(analysis.text, finding.fix, self.path_of(uri) or "")

    def code_actions(self, params: types.CodeActionParams) -> list[types.CodeAction]:
        uri = params.text_document.uri
        document = self.workspace.get_text_document(uri)
        analysis = self.analyses.get(uri)
        if analysis is None or analysis.version != document.version or analysis.text != document.source:
            analysis = self.analyze_now(uri)  # the published findings are stale: never offer an old edit
        wanted = params.range
        offered = [f for f in analysis.findings if f.fix is not None
                   and _overlaps(self.diagnostic(uri, analysis, f).range, wanted)]
        edits = {id(f): self.fix_lines(uri, analysis, f) for f in offered}
        actions = []
        for finding in offered:
            fix = finding.fix
            # An editor applies a preferred fix on its own ("fix all"): only one that keeps behaviour, and only when
            # no other fix offered here rewrites the same lines (the two edits would collide), its import removals
            # included (two fixes freeing two names of one import line)
            preferred = fix.safe and not any(
                a.start_line <= b.end_line and b.start_line <= a.end_line
                for other in offered if other is not finding for a in edits[id(finding)] for b in edits[id(other)])
            actions.append(types.CodeAction(
                title=f"Fix {finding.rule} ({finding.slug})" + ("" if fix.safe else " - changes behaviour, review it"),
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[self.diagnostic(uri, analysis, finding)],
                is_preferred=preferred,
                edit=types.WorkspaceEdit(changes={uri: [self.line_edit(uri, analysis.text, line_fix)
                                                        for line_fix in edits[id(finding)]]}),
            ))
        return actions


def _overlaps(a: types.Range, b: types.Range) -> bool:
    def key(p: types.Position) -> tuple[int, int]:
        return (p.line, p.character)

    return key(a.start) <= key(b.end) and key(b.start) <= key(a.end)


def _is_python(document_uri: str, language_id: Optional[str]) -> bool:
    return language_id == "python" or document_uri.endswith(".py")


def build_server(debounce: float = 0.3) -> TorchreviewServer:
    server = TorchreviewServer(debounce)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: TorchreviewServer, params: types.DidOpenTextDocumentParams) -> None:
        if _is_python(params.text_document.uri, params.text_document.language_id):
            ls.schedule(params.text_document.uri, 0)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: TorchreviewServer, params: types.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        document = ls.workspace.get_text_document(uri)
        if _is_python(uri, document.language_id):
            ls.schedule(uri, ls.debounce)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: TorchreviewServer, params: types.DidSaveTextDocumentParams) -> None:
        # a saved model.py can change what train.py's findings are: refresh every open Python document
        for uri, document in list(ls.workspace.text_documents.items()):
            if _is_python(uri, document.language_id):
                ls.schedule(uri, 0)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: TorchreviewServer, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        timer = ls.pending.pop(uri, None)
        if timer is not None:
            timer.cancel()
        ls.analyses.pop(uri, None)
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))

    @server.feature(types.TEXT_DOCUMENT_CODE_ACTION,
                    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix]))
    def code_action(ls: TorchreviewServer, params: types.CodeActionParams) -> list[types.CodeAction]:
        return ls.code_actions(params)

    return server


def serve(debounce: float = 0.3) -> None:
    logging.basicConfig(level=logging.WARNING)  # stderr: stdout carries the protocol
    build_server(debounce).start_io()
