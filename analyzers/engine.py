"""Parse each file once, walk it once, run every active rule on the shared context."""
from __future__ import annotations

import ast
import gc
import io
import os
import re
import time
import tokenize
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Optional, Sequence

import threading

import libcst as cst
from libcst._nodes.base import CSTNode

from analyzers import levels, notebook, pickles
from analyzers.config import Config
from analyzers.context import CHILD_FIELDS, NODE_TYPES, FileContext, dotted_name, forget_ast, keep_ast
from analyzers.guard import complexity_error
from analyzers.hints import SourceHints
from analyzers.isolation import run_isolated
from analyzers.model import FileError, FileResult, Finding, Fix, Location, Severity
from analyzers.program.harm import HarmContext
from analyzers.program.versions import VersionFacts
from analyzers.program.modules import RepositoryIndex, index_for
from analyzers.rules import all_rules, canonical_rule_id
from analyzers.rules.base import Rule
from analyzers.torchfix_map import is_torchfix_selector, rules_for_torchfix

MAX_FILE_BYTES = 1_000_000  # ~25k lines; libcst needs >1 GB for files much larger than that
ML_LIBRARIES = ("torch", "sklearn", "tensorflow", "lightning", "pytorch_lightning")
_ML_HINT = re.compile(r"\b(?:torch|torchvision|functorch|sklearn|tensorflow|lightning)\b")
# libraries that exist only on top of torch: a file importing one is torch code even without ``import torch``
_TORCH_EXTENSIONS = ("lightning", "pytorch_lightning", "torchvision", "functorch")
_SUPPRESS = re.compile(r"#\s*(?:torchreview\s*:\s*ignore|noqa)\b(?:\s*(?:\[|:)\s*([A-Za-z0-9_,\s-]+)\]?)?", re.I)
_SKIP_FILE = re.compile(r"^\s*#\s*torchreview\s*:\s*skip-file\b", re.I | re.M)  # a whole-line comment


class _Walker:
    """Walks a module once, maintaining the context's stacks and dispatching to rule handlers.

    Iterative (deeply nested expressions cannot overflow the stack) and read-only: libcst's
    own visitor rebuilds every node and visits every whitespace token, which costs more than
    all the rules together.
    """

    def __init__(self, ctx: FileContext, rules: list[Rule], on_rule_error) -> None:
        self.ctx = ctx
        visits, leaves = _handler_names(tuple(type(rule) for rule in rules))
        self.visit_table = _Handlers(rules, visits)
        self.leave_table = _Handlers(rules, leaves)
        self.leave_types = frozenset(leaves)
        self.on_rule_error = on_rule_error
        self.failed: set[int] = set()

    def _dispatch(self, handlers, node) -> None:
        ctx = self.ctx
        failed = self.failed
        for rule, handler in handlers:
            if failed and id(rule) in failed:
                continue
            try:
                handler(node, ctx)
            except Exception as exc:  # one broken rule must not stop the others
                self.failed.add(id(rule))
                self.on_rule_error(rule, exc)

    def walk(self, root: cst.CSTNode) -> None:
        """Pre-order visits, post-order leaves. Hot: one loop, no call per node unless a rule or the
        context's bookkeeping needs that node type, and a leave only for the types that need one."""
        fields = CHILD_FIELDS
        node_types = NODE_TYPES
        visit_table = self.visit_table
        leave_table = self.leave_table
        needs_leave = _LEAVE_BOOKKEEPING | self.leave_types
        dispatch = self._dispatch
        parents = self.ctx.parents
        leave_marker = _LEAVE
        todo: list = [(root, None)]
        pop, push = todo.pop, todo.append
        while todo:
            node, parent = pop()
            if node is leave_marker:
                node = parent
                node_type = type(node)
                handlers = leave_table[node_type]
                if handlers:
                    dispatch(handlers, node)
                if node_type in _LEAVE_BOOKKEEPING:
                    self._leave(node, node_type)
                continue
            node_type = type(node)
            if parent is not None:
                parents[id(node)] = parent
            if node_type in _VISIT_BOOKKEEPING:
                self._visit(node, node_type, parent)
            handlers = visit_table[node_type]
            if handlers:
                dispatch(handlers, node)
            if node_type in needs_leave:
                push((leave_marker, node))
            # code_children(node), inlined: a call per node is measurable here
            names = fields[node_type]
            children = []
            for name in names:
                value = getattr(node, name)
                value_type = type(value)
                if value_type in node_types:
                    children.append((value, node))
                elif value_type is tuple or value_type is list:
                    children.extend([(v, node) for v in value if type(v) in node_types])
            children.reverse()
            todo.extend(children)

    def _visit(self, node: cst.CSTNode, node_type: type, parent: Optional[cst.CSTNode]) -> None:
        ctx = self.ctx
        ctx.names_changed()  # a scope or an import may begin here
        if node_type is cst.IndentedBlock or node_type is cst.SimpleStatementSuite:
            if parent is not None:
                self._enter_block(parent, node)
        elif node_type is cst.FunctionDef or node_type is cst.Lambda:
            ctx.functions.append(node)
            ctx.scopes.append(_scope(node))
            self._bind_params(node)
        elif node_type is cst.ClassDef:
            ctx.classes.append(node)
            ctx.scopes.append(_scope(node))
            ctx.class_attributes.append({})
        elif node_type in _COMPREHENSIONS:
            ctx.loop_function[node] = ctx.function
            ctx.loops.append(node)
        elif node_type is cst.Import or node_type is cst.ImportFrom:
            if ctx.functions or ctx.classes:
                ctx.imports.add(node)
        elif node_type is cst.CompFor:
            ctx.record_binding(node.target, None, node, "for")

    def _enter_block(self, parent: cst.CSTNode, block: cst.CSTNode) -> None:
        parent_type = type(parent)
        ctx = self.ctx
        if (parent_type is cst.For or parent_type is cst.While) and parent.body is block:
            if parent_type is cst.For:
                # the target is bound from its iterable before the body runs
                ctx.record_binding(parent.target, parent.iter, parent, "for")
            ctx.loop_function[parent] = ctx.function
            ctx.loops.append(parent)
        elif parent_type is cst.With and parent.body is block:
            ctx.withs.append(parent)

    def _leave(self, node: cst.CSTNode, node_type: type) -> None:
        ctx = self.ctx
        ctx.names_changed()  # a scope may end or a name be bound here
        if node_type is cst.IndentedBlock or node_type is cst.SimpleStatementSuite:
            parent = ctx.parents.get(id(node))
            parent_type = type(parent)
            if (parent_type is cst.For or parent_type is cst.While) and parent.body is node:
                ctx.loops.pop()
            elif parent_type is cst.With and parent.body is node:
                ctx.withs.pop()
        elif node_type is cst.FunctionDef or node_type is cst.Lambda:
            ctx.functions.pop()
            ctx.scopes.pop()
            if node_type is cst.FunctionDef:
                ctx.record_binding(node.name, None, node, "def")
        elif node_type is cst.ClassDef:
            ctx.classes.pop()
            ctx.scopes.pop()
            ctx.class_attributes.pop()
            ctx.record_binding(node.name, None, node, "def")
        elif node_type in _COMPREHENSIONS:
            ctx.loops.pop()
        elif node_type is cst.Assign:
            for target in node.targets:
                ctx.record_binding(target.target, node.value, node, "assign")
            if not ctx.functions and not ctx.classes:
                self._maybe_module_alias(node)
        elif node_type is cst.AnnAssign:
            ctx.record_binding(node.target, node.value, node, "annassign")
        elif node_type is cst.AugAssign:
            ctx.record_binding(node.target, node, node, "augassign")
        elif node_type is cst.NamedExpr:
            ctx.record_binding(node.target, node.value, node, "walrus")
        elif node_type is cst.WithItem:
            if node.asname is not None:
                ctx.record_binding(node.asname.name, node.item, node, "with")

    def _bind_params(self, fn) -> None:
        params = fn.params
        for group in (params.posonly_params, params.params, params.kwonly_params):
            for param in group:
                self.ctx.record_binding(param.name, param.default, param, "param")
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                self.ctx.record_binding(star.name, None, star, "param")

    def _maybe_module_alias(self, node: cst.Assign) -> None:
        # ``F = torch.nn.functional`` makes F resolve like an import alias.
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            resolved = self.ctx.qualified_name(node.value) if isinstance(node.value, (cst.Name, cst.Attribute)) else None
            if resolved and resolved.split(".", 1)[0] in ML_LIBRARIES:
                self.ctx.imports.names[node.targets[0].target.value] = resolved
                self.ctx.names_changed()


_HANDLER_NAMES: dict[tuple, tuple[dict, dict]] = {}


def _handler_names(classes: tuple[type[Rule], ...]) -> tuple[dict, dict]:
    """node type -> [(position of the rule in ``classes``, its handler's name)], for visits and for leaves; the
    same for every file that runs the same rules."""
    found = _HANDLER_NAMES.get(classes)
    if found is None:
        visits: dict[type, list] = {}
        leaves: dict[type, list] = {}
        for position, cls in enumerate(classes):
            for node_cls, name in cls._visit_handlers.items():
                visits.setdefault(node_cls, []).append((position, name))
            for node_cls, name in cls._leave_handlers.items():
                leaves.setdefault(node_cls, []).append((position, name))
        if len(_HANDLER_NAMES) > 256:
            _HANDLER_NAMES.clear()
        found = _HANDLER_NAMES[classes] = (visits, leaves)
    return found


class _Handlers(dict):
    """node type -> [(rule, its bound handler)] for one file's rules, bound on the first node of each type (a
    file meets a fraction of the types the rules handle); an empty list for a type no rule handles."""

    def __init__(self, rules: list[Rule], names: dict[type, list]) -> None:
        super().__init__()
        self.rules = rules
        self.names = names

    def __missing__(self, node_type: type) -> list:
        rules = self.rules
        found = self[node_type] = [(rules[position], getattr(rules[position], name))
                                   for position, name in self.names.get(node_type, ())]
        return found


_LEAVE = object()
_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
_BLOCKS = {cst.IndentedBlock, cst.SimpleStatementSuite}
_SCOPES = {cst.FunctionDef, cst.Lambda, cst.ClassDef}
_VISIT_BOOKKEEPING = _BLOCKS | _SCOPES | set(_COMPREHENSIONS) | {cst.Import, cst.ImportFrom, cst.CompFor}
_LEAVE_BOOKKEEPING = _BLOCKS | _SCOPES | set(_COMPREHENSIONS) | {
    cst.Assign, cst.AnnAssign, cst.AugAssign, cst.NamedExpr, cst.WithItem}


def _scope(node):
    from analyzers.context import Scope

    return Scope(node)


# ---------------------------------------------------------------------------------------------
# Running rules over one source string


def imported_libraries(ctx: FileContext) -> set[str]:
    libraries = {lib for lib in ML_LIBRARIES if ctx.imports.imports_root(lib)}
    if any(ctx.imports.imports_root(lib) for lib in _TORCH_EXTENSIONS):
        libraries.add("torch")
    return libraries


_VALIDATE_NODE = CSTNode.__post_init__
_unvalidated_parses = 0
_unvalidated_lock = threading.Lock()


def _skip_validation(self: CSTNode) -> None:
    return None


def parse_module(source: str) -> cst.Module:
    """``cst.parse_module`` without re-validating every node the parser builds.

    The parser only builds valid trees, yet each node's ``__post_init__`` checks itself again: ~14 % of a parse
    (bench/static.py's sample; libcst's own PERF note on ``CSTNode.__post_init__`` says as much). Validation is
    off only while a parse runs (counted, so overlapping parses in threads restore it once, after the last);
    the nodes rules and fixes build afterwards are validated as usual."""
    global _unvalidated_parses
    with _unvalidated_lock:
        _unvalidated_parses += 1
        CSTNode.__post_init__ = _skip_validation
    try:
        return cst.parse_module(source)
    finally:
        with _unvalidated_lock:
            _unvalidated_parses -= 1
            if not _unvalidated_parses:
                CSTNode.__post_init__ = _VALIDATE_NODE


_collector_pauses = 0
_collector_resumes = False  # whether the collector was on when the first of the overlapping analyses began


@contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while one file is analyzed.

    A parse allocates a tree of hundreds of thousands of nodes; every 700 allocations start a collection, and
    the older generations' collections traverse every live object again (the tree itself once promoted, the
    rules' modules, libcst): a fifth of a bare libcst parse on the torch sources. Nothing an analysis builds
    needs collecting before it ends: what it drops is freed by reference counting, and the cycles it leaves
    (the facts and their context, which hold the tree) are freed by one collection of the young generation
    as it ends. Counted like the parser's validation switch: overlapping analyses in threads resume it once, after
    the last, and only when it was on."""
    global _collector_pauses, _collector_resumes
    with _unvalidated_lock:
        if not _collector_pauses:
            _collector_resumes = gc.isenabled()
            gc.disable()
        _collector_pauses += 1
    try:
        yield
    finally:
        with _unvalidated_lock:
            _collector_pauses -= 1
            if not _collector_pauses and _collector_resumes:
                gc.enable()
                gc.collect(0)  # what the analysis left in cycles, now, once: its cost, not the next file's


def analyze_source(source: str, path: str = "<string>", config: Optional[Config] = None,
                   rules: Optional[Sequence[type[Rule]]] = None,
                   repository: Optional[RepositoryIndex] = None) -> FileResult:
    """Analyze Python source text. ``rules`` overrides the config's selection (used by tests);
    ``repository`` is the rest of the code base, for questions that cross files."""
    with _collector_paused():
        return _analyze_source(source, path, config, rules, repository)


def _analyze_source(source: str, path: str, config: Optional[Config], rules: Optional[Sequence[type[Rule]]],
                    repository: Optional[RepositoryIndex]) -> FileResult:
    config = config or Config()
    result = FileResult(path)
    if _SKIP_FILE.search(source) and _skips_file(source):
        result.skipped_by_comment = True
        return result
    if not _ML_HINT.search(source):
        return result  # cannot import torch/sklearn: not ML code, not worth a parse
    too_complex = complexity_error(source, path)
    if too_complex is not None:
        result.errors.append(too_complex)
        return result
    try:
        module = parse_module(source)
    except cst.ParserSyntaxError as exc:
        result.errors.append(FileError(path, "syntax-error", syntax_error_detail(source, exc)))
        return result
    except RecursionError:
        result.errors.append(FileError(path, "syntax-error", "expression nested too deeply to parse"))
        return result
    ctx = FileContext(path, source, module)
    ctx.repository = repository
    instances: list[Rule] = []
    keep_ast(source)  # its positions and its summary share one ``ast`` parse
    try:
        return _run_rules(ctx, result, source, path, config, rules, instances)
    finally:
        # The file is done: forget what its context and its rules hold. Facts hold the context, and rules the
        # facts that hold them; those cycles would keep the whole syntax tree alive until the garbage collector
        # traverses it, where reference counting frees it now.
        ctx.release()
        for rule in instances:
            rule.__dict__.clear()
        forget_ast()


def _run_rules(ctx: FileContext, result: FileResult, source: str, path: str, config: Config,
               rules: Optional[Sequence[type[Rule]]], instances: list[Rule]) -> FileResult:
    module = ctx.module
    libraries = imported_libraries(ctx)
    candidates = rules if rules is not None else _enabled_rules(config)
    hints = SourceHints(source)

    def may_report(cls: type[Rule]) -> bool:
        options = config.rule_options(cls.id)  # TorchFix's wider scope may need less text than the hint
        return cls.may_report_on(source, options) if options else hints.admit(cls)

    classes = [cls for cls in candidates if cls.requires in libraries and may_report(cls)]
    if not classes:
        return result
    instances.extend(cls(ctx) for cls in classes)
    for rule in instances:
        options = config.rule_options(rule.id)
        if options:  # TorchFix's wider scope, for a TOR code the configuration selected
            rule.options = options

    def rule_error(rule: Rule, exc: BaseException) -> None:
        result.errors.append(FileError(path, "rule-error", f"{rule.id} ({rule.slug}) failed: {type(exc).__name__}: {exc}"))

    walker = _Walker(ctx, instances, rule_error)
    try:
        walker.walk(module)
    except RecursionError:
        result.errors.append(FileError(path, "rule-error", "code nested too deeply to analyze"))
        return result
    ctx.walked = True
    for rule in instances:
        if id(rule) in walker.failed:
            continue
        try:
            rule.end_file(ctx)
        except Exception as exc:
            rule_error(rule, exc)
    pending = [(rule, p) for rule in instances for p in rule.pending]
    if not pending:
        return result
    positions = ctx.positions([p.node for _, p in pending] +
                              [site for _, p in pending for site, _ in p.related if isinstance(site, cst.CSTNode)])
    lines = source.splitlines(keepends=True)
    suppressions = _suppressions(source) if ("noqa" in source or "torchreview" in source) else {}
    seen: set[tuple] = set()
    for rule, p in pending:
        pos = positions.get(p.node)
        if pos is None:
            continue
        start, end = pos.start, pos.end
        suppressed = _suppressed(suppressions, rule.id, start.line, end.line)
        if config.context_severity and levels.context_silences(rule.speed_only, ctx.facts(HarmContext).role):
            continue  # speed advice where the code never runs at scale
        severity, context = _severity(rule, p.severity or rule.severity, config, ctx)
        if config.context_severity and rule.id not in config.severity and \
                levels.context_drops(severity, rule.category.value, ctx.facts(HarmContext).role):
            continue  # low in a test (already, or once lowered): hygiene advice a test does not need
        key = (rule.id, start.line, start.column, p.message)
        if key in seen:
            continue
        seen.add(key)
        fix = None
        if p.replacement is not None and not suppressed:
            safe = p.safe if p.safe is not None else rule.fix_safety == "safe"
            fix = _render_fix(module, lines, pos, p.replacement, safe)
        (result.suppressed if suppressed else result.findings).append(Finding(
            path=path, line=start.line, column=start.column + 1, end_line=end.line, end_column=end.column + 1,
            rule=rule.id, slug=rule.slug, category=rule.category.value, severity=severity,
            message=_stating_assumption(p.message, p.pins, ctx), fix=fix,
            related=_related_locations(p.related, positions),
            preview=levels.is_preview(rule.id), context=context,
        ))
    result.findings = [f for f in result.findings if f.severity >= config.min_severity]
    result.suppressed = [f for f in result.suppressed if f.severity >= config.min_severity]
    result.findings.sort(key=lambda f: f.sort_key)
    result.suppressed.sort(key=lambda f: f.sort_key)
    return result


_ENABLED: dict[tuple, list[type[Rule]]] = {}


def _enabled_rules(config: Config) -> list[type[Rule]]:
    """The configuration's selection, matched once per configuration rather than once per file."""
    catalog = all_rules()
    key = (config.select, config.ignore, config.preview, tuple(catalog))
    enabled = _ENABLED.get(key)
    if enabled is None:
        if len(_ENABLED) > 64:  # a long-lived App sees a configuration per repository
            _ENABLED.clear()
        enabled = _ENABLED[key] = config.enabled_rules(catalog)
    return enabled


def _stating_assumption(message: str, package: Optional[str], ctx: FileContext) -> str:
    """A version-dependent finding says which release of ``package`` it assumed (the pin, or that none was
    found), once."""
    if package is None:
        return message
    assumed = ctx.facts(VersionFacts).assumption(package)
    return message if assumed in message else f"{message} ({assumed})"


def _severity(rule: Rule, severity: Severity, config: Config, ctx: FileContext) -> tuple[Severity, Optional[str]]:
    """A finding's severity: the rule's, capped at its measured level, lowered where the file's role makes the
    harm small (with why, for the output); an explicit ``severity:`` in the configuration wins over both."""
    if rule.id in config.severity:
        return config.severity[rule.id], None
    if config.measured_severities:
        severity = levels.capped(rule.id, severity)
    if not config.context_severity:
        return severity, None
    return levels.context_lowered(severity, rule.category.value, ctx.facts(HarmContext).role)


def syntax_error_detail(source: str, exc: cst.ParserSyntaxError) -> str:
    """``line L, column C: problem`` as Python reports it: libcst points past the error (the line
    after ``def f(:``), and people compare with what ``python`` says."""
    try:
        compile(source, "<source>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as python:
        if python.lineno:
            return f"line {python.lineno}, column {python.offset or 1}: {python.msg}"
    except (ValueError, RecursionError, MemoryError):
        pass  # Python cannot say either: libcst's position is the best there is
    return f"line {exc.raw_line}, column {exc.raw_column}: {exc.message}"


def _related_locations(sites, positions) -> tuple[Location, ...]:
    found = []
    for site, what in sites:
        if isinstance(site, int):
            found.append(Location(site, 1, site, 1, what))
            continue
        pos = positions.get(site)
        if pos is not None:
            found.append(Location(pos.start.line, pos.start.column + 1, pos.end.line, pos.end.column + 1, what))
    return tuple(found)


def _render_fix(module: cst.Module, lines: list[str], pos, replacement: cst.CSTNode, safe: bool = True) -> Optional[Fix]:
    start, end = pos.start, pos.end
    if start.line < 1 or end.line > len(lines):
        return None
    first = lines[start.line - 1]
    last = lines[end.line - 1]
    new_code = module.code_for_node(replacement)
    newline = "\n" if not last.endswith("\r\n") else "\r\n"
    tail = last[end.column:].rstrip("\r\n")
    text = first[: start.column] + new_code + tail + newline
    return Fix(start.line, end.line, text, safe)


def comments(source: str) -> dict[int, tuple[str, bool]]:
    """line number -> (its comment, whether the comment is the whole line), as Python's tokenizer finds them:
    ``# noqa`` inside a string or a docstring is text, not a comment, and suppresses nothing. A file the tokenizer
    stops on has the comments read up to there (the parser then reports the error)."""
    found: dict[int, tuple[str, bool]] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                found[token.start[0]] = (token.string, not token.line[:token.start[1]].strip())
    except (tokenize.TokenError, SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    return found


def _skips_file(source: str) -> bool:
    """A ``# torchreview: skip-file`` comment on a line of its own (not text in a string that looks like one)."""
    return any(whole and _SKIP_FILE.match(text) for text, whole in comments(source).values())


def _suppressions(source: str) -> dict[int, Optional[set[str]]]:
    """line number -> set of suppressed rule ids (None: every rule), from comments only."""
    out: dict[int, Optional[set[str]]] = {}
    for number, (text, _whole) in comments(source).items():
        match = _SUPPRESS.search(text)
        if not match:
            continue
        codes = match.group(1)
        if not codes:
            out[number] = None
            continue
        named = {c.strip().upper() for c in re.split(r"[,\s]+", codes) if c.strip()}
        # TorchFix's ``# noqa: TOR102`` (or a prefix, as flake8 reads it) stands for the rules that cover it;
        # a retired id (an alias) for the rule that took its cases over
        ids = {canonical_rule_id(c) for c in named if c.startswith("TR")} | \
            {rule for c in named if is_torchfix_selector(c) for rule in rules_for_torchfix(c)}
        if "noqa" in match.group(0).lower() and not ids:
            continue  # ``# noqa: E501`` is for other linters
        out[number] = ids or None
    return out


def _suppressed(table: dict[int, Optional[set[str]]], rule_id: str, line: int, end_line: int) -> bool:
    for number in (line, end_line):
        if number in table:
            ids = table[number]
            if ids is None or rule_id in ids:
                return True
    return False


# ---------------------------------------------------------------------------------------------
# Files and notebooks


def read_source(path: Path, display: str) -> tuple[Optional[str], Optional[FileError]]:
    try:
        size = path.stat().st_size
        if size > _size_limit(display):
            return None, _too_large(display, size)
        data = path.read_bytes()
    except OSError as exc:
        return None, FileError(display, "read-error", str(exc))
    return decode_source(data, display)


def _size_limit(display: str) -> int:
    # A notebook's outputs (images) are not analyzed: its code cells have the normal limit, checked once read.
    return notebook.MAX_NOTEBOOK_BYTES if display.endswith(".ipynb") else MAX_FILE_BYTES


def _too_large(display: str, size: int) -> FileError:
    limit = _size_limit(display)
    return FileError(display, "too-large", f"{size} bytes is over the {limit}-byte limit; not analyzed")


def decode_source(data: bytes, display: str) -> tuple[Optional[str], Optional[FileError]]:
    """The file's text, or None and why not. A text may come with a note (kind ``unknown-codec``): read,
    analyzed, and said so, never a failure."""
    if len(data) > _size_limit(display):
        return None, _too_large(display, len(data))
    if b"\x00" in data[:8192]:
        return None, FileError(display, "binary-file", "contains NUL bytes; not a text file")
    encoding, note = "utf-8-sig", None
    if not display.endswith(".ipynb"):  # notebooks are JSON, always UTF-8
        try:
            encoding, note = source_encoding(data, display)
        except SyntaxError as exc:
            return None, FileError(display, "decode-error", str(exc))
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        where = f" at byte {exc.start}: {exc.reason}" if isinstance(exc, UnicodeDecodeError) else ""
        return None, FileError(display, "decode-error", f"not valid {_encoding_name(encoding)}{where}")
    return text, note


def source_encoding(data: bytes, display: str) -> tuple[str, Optional[FileError]]:
    """How Python reads the file: PEP 263's ``# -*- coding: latin-1 -*-`` cookie on line 1 or 2, else UTF-8.
    A cookie naming a codec this Python lacks (``future_fstrings``, registered by a package at import time
    to rewrite the source) is read as UTF-8, with a note: those codecs take UTF-8 text."""
    try:
        return tokenize.detect_encoding(io.BytesIO(data).readline)[0], None
    except SyntaxError as exc:
        unknown = _UNKNOWN_CODEC.match(str(exc))
        if unknown is None:
            raise
        return "utf-8-sig", FileError(display, "unknown-codec",
                                      f"its coding cookie names {unknown.group(1)!r}, a codec this Python lacks; "
                                      "read as UTF-8")


_UNKNOWN_CODEC = re.compile(r"unknown encoding(?: for [^:]*)?: (.+)$")


def _encoding_name(encoding: str) -> str:
    return "UTF-8" if encoding in ("utf-8", "utf-8-sig") else encoding


def analyze_notebook_text(text: str | bytes, path: str, config: Config,
                          repository: Optional[RepositoryIndex] = None) -> FileResult:
    """Analyze a notebook's code cells as one program, as IPython runs them; findings carry the
    cell number and the line within the cell."""
    try:
        cells = notebook.read_cells(text)
    except notebook.NotebookError as exc:
        result = FileResult(path)
        result.errors.append(FileError(path, "notebook-error", str(exc)))
        return result
    return _analyze_notebook_cells(cells, path, config, repository)


def _analyze_notebook_cells(cells: list[notebook.Cell], path: str, config: Config,
                            repository: Optional[RepositoryIndex]) -> FileResult:
    result = FileResult(path)
    code_cells = [c for c in cells if c.cell_type == "code"]
    # The limit is on the code: embedded outputs (plots, images) do not make a notebook harder to parse.
    size = sum(len(c.source.encode("utf-8", "surrogatepass")) + 1 for c in code_cells)
    if size > MAX_FILE_BYTES:
        result.errors.append(FileError(path, "too-large", f"its code cells are {size} bytes, over the "
                                                          f"{MAX_FILE_BYTES}-byte limit; not analyzed"))
        return result
    code = [(c.number, py) for c in code_cells for py in [notebook.cell_to_python(c.source)] if py is not None]
    combined = _analyze_cells(code, path, config, repository)
    if not any(e.kind == "syntax-error" for e in combined.errors):
        return combined
    # One broken cell should not hide the others: report it, analyze the rest together.
    broken: list[FileError] = []
    broken_cells: set[int] = set()
    for number, py in code:
        if complexity_error(py.source, path) is not None:
            continue  # reported when the cells are analyzed together
        detail = _cell_syntax_error(py)
        if detail is not None:
            hint = f" ({notebook.IPYTHON_HINT})" if py.needs_ipython else ""
            broken.append(FileError(path, "syntax-error", f"cell {number}, {detail}{hint}"))
            broken_cells.add(number)
    result = _analyze_cells([c for c in code if c[0] not in broken_cells], path, config, repository)
    result.errors = broken + [e for e in result.errors if e.kind != "syntax-error"]
    return result


def _cell_syntax_error(py: notebook.PythonCell) -> Optional[str]:
    """Where a cell does not parse, at its own line and column (before any dedent), or None."""
    source = py.source + "\n"
    try:
        cst.parse_module(source)
        return None
    except RecursionError:
        return "too deeply nested"
    except cst.ParserSyntaxError as exc:
        try:
            compile(source, "<cell>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        except SyntaxError as python:
            if python.lineno and python.lineno <= len(py.columns):
                column = (python.offset or 1) + py.columns[python.lineno - 1]
                return f"line {python.lineno}, column {column}: {python.msg}"
        except (ValueError, RecursionError, MemoryError):
            pass
        return syntax_error_detail(source, exc)


def _analyze_cells(code: list[tuple[int, notebook.PythonCell]], path: str, config: Config,
                   repository: Optional[RepositoryIndex] = None) -> FileResult:
    # program line -> (cell number, line in cell, columns removed, rewritten by IPython)
    line_map: list[tuple[int, int, int, bool]] = []
    for number, py in code:
        line_map.extend((number, i + 1, removed, i + 1 in py.rewritten) for i, removed in enumerate(py.columns))
    program = "\n".join(py.source for _, py in code) + "\n"
    result = analyze_source(program, path, config, repository=repository)
    _remap(result, line_map)
    return result


def _with_cell(f: Finding, cell: int, line: int, end_line: int, column: int, end_column: int,
               fix: Optional[Fix], line_map: Sequence[tuple[int, int, int, bool]] = ()) -> Finding:
    related = []
    for site in f.related:  # a location names no cell: keep the sites in the finding's own cell
        if site.line - 1 < len(line_map) and line_map[site.line - 1][0] == cell:
            start, shift = line_map[site.line - 1][1], line_map[site.line - 1][2]
            end = line_map[min(site.end_line, len(line_map)) - 1]
            if (site.column, site.end_column) != (1, 1):  # (1, 1): the whole line, no column to move
                site = replace(site, column=site.column + shift, end_column=site.end_column + end[2])
            related.append(replace(site, line=start, end_line=end[1] if end[0] == cell else start))
    return Finding(f.path, line, column, end_line, end_column, f.rule, f.slug, f.category, f.severity,
                   f.message, fix, cell, tuple(related), f.preview, f.context)


def _remap(result: FileResult, line_map: list[tuple[int, int, int, bool]]) -> None:
    result.findings = _remapped(result.findings, line_map)
    result.suppressed = _remapped(result.suppressed, line_map)


def _remapped(findings: list[Finding], line_map: list[tuple[int, int, int, bool]]) -> list[Finding]:
    remapped = []
    for f in findings:
        if f.line - 1 >= len(line_map):
            continue
        cell, line, shift, _ = line_map[f.line - 1]
        end_cell, end_line, end_shift, _ = line_map[min(f.end_line, len(line_map)) - 1]
        end_column = f.end_column + end_shift
        if end_cell != cell:
            end_line, end_column = line, f.column + shift
        fix = f.fix
        if fix is not None:
            span = line_map[fix.start_line - 1: fix.end_line]
            # A fix is whole lines of the program: a dedented cell's lines would lose their indent, and a
            # line IPython rewrote (``x = %time f()``) its magic.
            fix = (None if any(s or r for _, _, s, r in span) or {c for c, _, _, _ in span} != {cell}
                   else Fix(line + (fix.start_line - f.line), line + (fix.end_line - f.line), fix.replacement,
                            fix.safe))
        remapped.append(_with_cell(f, cell, line, end_line, f.column + shift, end_column, fix, line_map))
    return remapped


def analyze_file(path: Path, display: Optional[str] = None, config: Optional[Config] = None,
                 cache=None) -> FileResult:
    """``cache``: an :class:`analyzers.cache.ResultCache` to reuse (and store) the result."""
    config = config or Config()
    display = display or str(path)
    if display.endswith(".ipynb"):
        return _analyze_notebook_file(path, display, config)
    if pickles.is_checkpoint(display):  # read as opcodes, streamed; never decoded as text
        return pickles.checkpoint_result(path, display, config)
    text, note = read_source(path, display)
    if text is None:
        return FileResult(display, errors=[note])
    if cache is not None:
        result = cache.analyze(text, display, config, repository=index_for(path))
    else:
        result = analyze_text(text, display, config, repository=index_for(path))
    if note is not None:  # read with a note (a codec we lack): said, after the analysis (the cache keeps no notes)
        result.errors.append(note)
    return result


def _analyze_notebook_file(path: Path, display: str, config: Config) -> FileResult:
    # Streamed from the file to its cells: megabytes of plots in the outputs are never all in memory.
    try:
        size = path.stat().st_size
        if size > notebook.MAX_NOTEBOOK_BYTES:
            result = FileResult(display)
            result.errors.append(_too_large(display, size))
            return result
        with path.open("rb") as stream:
            cells = notebook.read_cells(stream)
    except OSError as exc:
        result = FileResult(display)
        result.errors.append(FileError(display, "read-error", str(exc)))
        return result
    except notebook.NotebookError as exc:
        result = FileResult(display)
        result.errors.append(FileError(display, "notebook-error", str(exc)))
        return result
    return _analyze_notebook_cells(cells, display, config, index_for(path))


def analyze_text(text: str, display: str, config: Config,
                 repository: Optional[RepositoryIndex] = None) -> FileResult:
    if display.endswith(".ipynb"):
        return analyze_notebook_text(text, display, config, repository=repository)
    return analyze_source(text, display, config, repository=repository)


# ---------------------------------------------------------------------------------------------
# Many files


@dataclass
class RunResult:
    findings: list[Finding] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    files: int = 0
    seconds: float = 0.0
    cached: int = 0  # files whose result came from the results cache

    def to_dict(self) -> dict:
        return {
            "findings": [f.to_dict() for f in self.findings],
            "errors": [e.to_dict() for e in self.errors],
            "stats": {"files": self.files, "seconds": round(self.seconds, 3)},
        }


def discover(paths: Iterable[str], config: Config) -> list[tuple[Path, str]]:
    """Expand files and directories into (path, display path) for .py and .ipynb files, and checkpoint files
    (:data:`analyzers.pickles.CHECKPOINT_SUFFIXES`)."""
    out: list[tuple[Path, str]] = []
    seen: set[str] = set()
    for raw in paths:
        root = Path(raw)
        if root.is_dir():
            candidates = []
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS)
                for name in sorted(filenames):
                    if name.endswith((".py", ".ipynb")) or pickles.is_checkpoint(name):
                        candidates.append(Path(dirpath) / name)
        else:
            candidates = [root]
        for candidate in candidates:
            display = candidate.as_posix()
            if display.startswith("./"):
                display = display[2:]
            if display in seen:
                continue
            explicit = not root.is_dir()
            if not explicit and not config.path_included(display):
                continue
            if explicit and config.path_excluded(display):
                continue
            seen.add(display)
            out.append((candidate, display))
    return out


_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", ".venv", "venv", ".git", ".tox", "build", "dist"}


def analyze_paths(paths: Iterable[str], config: Optional[Config] = None, jobs: Optional[int] = None,
                  cache=None) -> RunResult:
    config = config or Config()
    started = time.perf_counter()
    files = discover(paths, config)
    return analyze_files(files, config, jobs, started, cache=cache)


def analyze_files(files: list[tuple[Path, str]], config: Config, jobs: Optional[int] = None,
                  started: Optional[float] = None, cache=None) -> RunResult:
    """Every file in a forked child, bounded by ``config.file_timeout`` and a memory limit: a file that hangs or
    crashes the analysis is a ``timeout`` / ``parser-crash`` error and the run goes on."""
    started = started if started is not None else time.perf_counter()
    jobs = jobs or os.cpu_count() or 1
    if jobs > 1 and len(files) > 1:
        all_rules()  # imported once here and shared by the children, rather than once in each
    # Larger files first so one big file does not finish last on busy children.
    work = sorted(((d, str(p)) for p, d in files), key=lambda w: -_size(w[1]))
    results = run_isolated(work, lambda display, path: analyze_file(Path(path), display, config, cache),
                           lambda display, kind, message: FileResult(display, errors=[FileError(display, kind, message)]),
                           seconds=config.file_timeout, jobs=jobs)
    run = RunResult(files=len(work))
    _collect(run, results.values())
    run.findings.sort(key=lambda f: f.sort_key)
    run.errors.sort(key=lambda e: (e.path, e.kind))
    run.seconds = time.perf_counter() - started
    return run


def analyze_text_bounded(text: str, display: str, config: Config,
                         repository: Optional[RepositoryIndex] = None) -> FileResult:
    """:func:`analyze_text` in a forked child bounded by ``config.file_timeout`` (the language server, the base
    revision of ``--diff``): a file the analysis cannot finish is an error entry, never a hang."""
    results = run_isolated([(display, text)], lambda key, source: analyze_text(source, key, config, repository),
                           lambda key, kind, message: FileResult(key, errors=[FileError(key, kind, message)]),
                           seconds=config.file_timeout)
    return results[display]


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _collect(run: RunResult, results: Iterable[FileResult]) -> None:
    for result in results:
        run.findings.extend(result.findings)
        run.errors.extend(result.errors)
        run.cached += result.cached


def finding_fails(finding: Finding, level: Severity) -> bool:
    """Whether a finding fails a check run at ``level``: a preview rule's findings never do."""
    return not finding.preview and finding.severity >= level


def fails(findings: Iterable[Finding], level: Severity) -> bool:
    return any(finding_fails(f, level) for f in findings)


__all__ = [
    "analyze_source", "analyze_file", "analyze_text", "analyze_text_bounded", "analyze_paths", "analyze_files",
    "discover", "RunResult",
    "dotted_name", "finding_fails", "fails", "MAX_FILE_BYTES",
]
