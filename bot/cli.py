"""The ``torchreview`` command line."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def build_parser() -> argparse.ArgumentParser:
    from analyzers.output import FORMATS, tool_version

    parser = argparse.ArgumentParser(prog="torchreview", description="Review PyTorch code like a senior engineer.")
    parser.add_argument("--version", action="version", version=f"torchreview {tool_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = sub.add_parser("check", help="analyze files or directories",
                           description="Analyze Python files and notebooks. Exit 0: nothing at or above the fail "
                                       "level; 1: findings, or a file that could not be analyzed; 2: usage or "
                                       "configuration error.")
    check.add_argument("paths", nargs="*", default=["."], metavar="PATH")
    check.add_argument("--format", choices=FORMATS, default="text")
    check.add_argument("--select", type=_csv,
                       help="rule ids, prefixes (TR1), slugs, categories or TorchFix codes (TOR102, TOR1), comma-separated")
    check.add_argument("--ignore", type=_csv, help="rules to skip, same forms as --select")
    check.add_argument("--preview", action="store_true",
                       help="also run the preview rules (config preview: true); their findings never fail the run")
    check.add_argument("--min-severity", choices=["low", "medium", "high", "critical"], help="hide findings below this")
    check.add_argument("--fail-on", choices=["low", "medium", "high", "critical"],
                       help="exit 1 when a finding is at or above this severity (config fail_on, default high)")
    check.add_argument("--diff", metavar="GIT_REF", help="only report what changed since GIT_REF: findings the file at GIT_REF did not have "
                            "(config filter: introduced, the default) or on changed lines (filter: added)")
    check.add_argument("--jobs", "-j", type=int, default=0, help="parallel processes (default: all cores)")
    check.add_argument("--file-timeout", type=int, metavar="SECONDS",
                       help="stop analyzing a file after this long and report it as a timeout error "
                            "(default: the configuration's file_timeout, 60)")
    check.add_argument("--config", metavar="FILE", help="a .github/torchreview.yml, .torchreview.toml or pyproject.toml to use")
    check.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    check.add_argument("--exit-zero-on-errors", action="store_true",
                       help="files that could not be analyzed (syntax errors, undecodable, too large) do not make "
                            "the run fail (config fail_on_errors: false)")
    _add_fix_arguments(check)
    _add_cache_arguments(check)
    check.set_defaults(handler=cmd_check)

    rules = sub.add_parser("rules", help="list every rule")
    rules.add_argument("--format", choices=["text", "json"], default="text")
    rules.set_defaults(handler=cmd_rules)

    rule = sub.add_parser("rule", help="show one rule's documentation")
    rule.add_argument("rule_id", metavar="RULE", help="a rule id (TR101) or slug (missing-zero-grad)")
    rule.set_defaults(handler=cmd_rule)

    migrate = sub.add_parser("migrate-torchfix", help="rewrite a repository's TorchFix configuration into torchreview's",
                             description="Turn TorchFix's flake8 settings, CI step and pre-commit hook into "
                                         "torchreview's (a .torchreview.toml selecting the rules that cover the "
                                         "TorchFix codes that were on) and print the diff; --write applies it.")
    migrate.add_argument("path", nargs="?", default=".", metavar="PATH", help="the repository (default: .)")
    migrate.add_argument("--write", action="store_true", help="apply the changes instead of only printing them")
    migrate.set_defaults(handler=cmd_migrate_torchfix)

    serve = sub.add_parser("serve", help="run the GitHub App webhook (and, without REDIS_URL, a worker too)")
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, help="default: $PORT or 3000")
    serve.add_argument("--web-workers", type=int, default=2, help="gunicorn worker processes")
    serve.add_argument("--concurrency", type=int, default=2, help="review jobs at once in the embedded worker")
    serve.set_defaults(handler=cmd_serve)

    worker = sub.add_parser("worker", help="run review workers (scale out: more of these, same REDIS_URL)")
    worker.add_argument("--concurrency", type=int, default=2)
    worker.add_argument("--queues", default="reviews", help="comma-separated queues (gpu for smoke runners)")
    worker.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="Prometheus /metrics of this worker and its pool (default: "
                             "$TORCHREVIEW_WORKER_METRICS_PORT or 9191; 0: none)")
    worker.add_argument("--beat", action="store_true",
                        help="also run the schedule (the delivery sweep every $TORCHREVIEW_RECOVER_INTERVAL s); "
                             "one worker of the deployment is enough, more are harmless")
    worker.set_defaults(handler=cmd_worker)

    recover = sub.add_parser("recover", help="redeliver the App's webhook deliveries that failed (cron, CronJob)",
                             description="List the App's webhook deliveries of the last DURATION through GitHub's "
                                         "REST API and redeliver the events that no attempt delivered. Idempotent: "
                                         "an event the App already took is not redelivered. Exit 1 when some could "
                                         "not be redelivered.")
    recover.add_argument("--since", default="24h", metavar="DURATION",
                         help="how far back to look: 24h, 90m, 2d, 1h30m (at most 72h, what GitHub keeps; "
                              "default 24h)")
    recover.set_defaults(handler=cmd_recover)

    smoke = sub.add_parser("smoke", help="smoke-train nn.Modules for a few steps, sandboxed, and check them",
                           description="Build and train the nn.Module classes of a file (or one class) for a few "
                                       "steps in a sandboxed process, run the smoke checks, and compare with a base "
                                       "revision. Exit 1 when a check fails or a regression is flagged.")
    smoke.add_argument("target", metavar="PATH[:Class]", nargs="?",
                       help="a .py file, optionally :ClassOrFactory or :train_step; omitted: the config's "
                            "smoke.targets and smoke.steps")
    smoke.add_argument("--config", metavar="FILE",
                       help="a .github/torchreview.yml, .torchreview.toml or pyproject.toml whose smoke.targets / "
                            "smoke.steps say how to build, feed and train the models (default: the repository's)")
    smoke.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    smoke.add_argument("--steps", type=int, default=50, help="optimizer steps for the overfit check (default 50)")
    smoke.add_argument("--base", metavar="GIT_REF", help="also run the same targets at this revision and compare")
    smoke.add_argument("--timeout", type=float, default=300.0, help="seconds per target and revision")
    smoke.add_argument("--format", choices=["text", "json"], default="text")
    smoke.set_defaults(handler=cmd_smoke)

    _add_cache_and_lsp_commands(sub)

    feedback = sub.add_parser("feedback", help="what became of the App's comments, per installation and rule",
                              description="Per installation and rule, from the App's store (REDIS_URL, else "
                                          "TORCHREVIEW_DATA_DIR): comments posted, 👎 and `/review false-positive` "
                                          "verdicts from users with write access, threads resolved by a fix (the "
                                          "finding disappeared after a push), threads a person resolved with the "
                                          "finding still there.")
    feedback.add_argument("--format", choices=["table", "json"], default="table")
    feedback.add_argument("--repository", metavar="OWNER/NAME", help="only this repository")
    feedback.add_argument("--installation", type=int, metavar="ID", help="only this installation")
    feedback.set_defaults(handler=cmd_feedback)
    feedback_sub = feedback.add_subparsers(dest="feedback_command", metavar="[export]")
    export = feedback_sub.add_parser("export", help="print every recorded verdict as JSON (the App's store: "
                                                    "REDIS_URL, else TORCHREVIEW_DATA_DIR)")
    export.add_argument("--repository", metavar="OWNER/NAME", help="only this repository")
    export.set_defaults(handler=cmd_feedback_export)

    demo = sub.add_parser("demo", help="watch a pull request get reviewed, with a local GitHub emulator")
    demo.add_argument("--keep", action="store_true", help="leave the emulator and app running until Ctrl-C")
    demo.add_argument("--part", choices=("all", "static", "smoke"), default="all",
                      help="static: the review and check run (no torch needed); smoke: the GPU runner (needs torch)")
    demo.set_defaults(handler=cmd_demo)
    return parser


def cmd_check(args: argparse.Namespace) -> int:
    from analyzers.config import ConfigError, find_config, load_config_file
    from analyzers.diff import DiffError, git_changed_lines, keep_changed, keep_introduced
    from analyzers.engine import analyze_paths, fails
    from analyzers.output import render

    for path in args.paths:
        if not Path(path).exists():
            raise UsageError(f"{path}: no such file or directory")
    if args.jobs < 0:
        raise UsageError("--jobs must be 0 (all cores) or more")
    try:
        config = load_config_file(Path(args.config)) if args.config else find_config(Path.cwd())
        config = config.merged_with_cli(select=args.select, ignore=args.ignore, min_severity=args.min_severity,
                                        fail_on=args.fail_on, file_timeout=args.file_timeout, preview=args.preview)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.fix or args.diff_fixes:
        return _check_fix(args, config)
    changed = None
    if args.diff:  # before the analysis: a bad ref or no repository is a usage error, found at once
        try:
            changed = git_changed_lines(args.diff)
        except DiffError as exc:
            raise UsageError(str(exc)) from None
    paths = [_relative(p) for p in args.paths]
    run = analyze_paths(paths, config, jobs=args.jobs or os.cpu_count(), cache=_result_cache(args))
    if changed is not None:  # the App's filter: what the change causes, or what it touches
        try:
            run.findings = (keep_introduced(run.findings, changed, args.diff, config) if config.filter == "introduced"
                            else keep_changed(run.findings, changed))
        except DiffError as exc:  # the tree at the ref could not be read
            raise UsageError(str(exc)) from None
        run.errors = _changed_files_errors(run.errors, changed, args.diff)
    color = {"always": True, "never": False}.get(args.color)
    render(run, args.format, sys.stdout, color=color)
    # like ruff: a file that could not be analyzed fails the run (a crashing rule is our bug, not the file's)
    unanalyzed = [e for e in run.errors if e.unanalyzed]
    if unanalyzed and config.fail_on_errors and not args.exit_zero_on_errors:
        return EXIT_FINDINGS
    return EXIT_FINDINGS if fails(run.findings, config.fail_on) else EXIT_OK


# --- check --fix / --diff-fixes / --unsafe-fixes ------------------------------------------------


def _add_fix_arguments(check: argparse.ArgumentParser) -> None:
    check.add_argument("--fix", action="store_true",
                       help="apply the safe mechanical fixes in place, then report what remains")
    check.add_argument("--diff-fixes", action="store_true",
                       help="print the fixes as a unified diff instead of writing them (exit 1 when there are any)")
    check.add_argument("--unsafe-fixes", action="store_true",
                       help="with --fix/--diff-fixes, also apply fixes that change behaviour (e.g. weights_only=True)")


def _changed_files_errors(errors, changed, ref: str) -> list:
    """With --diff: only the changed files' errors count; how many others there were goes to stderr."""
    from analyzers.diff import keep_changed_files_errors

    kept = keep_changed_files_errors(errors, changed)
    others = len({e.path for e in errors}) - len({e.path for e in kept})
    if others:
        print(f"{others} file{'s' if others != 1 else ''} not changed since {ref} could not be fully analyzed; "
              "not reported (run without --diff to see them)", file=sys.stderr)
    return kept


def _check_fix(args: argparse.Namespace, config) -> int:
    from analyzers.diff import DiffError, git_changed_lines
    from analyzers.engine import discover, fails
    from analyzers.fixer import fix_files, unsafe_fixes_left
    from analyzers.output import render

    changed_lines = None
    if args.diff:
        try:
            changed_lines = git_changed_lines(args.diff)  # a bad ref or no repository: a usage error before anything is written
        except DiffError as exc:
            raise UsageError(str(exc)) from None
    files = discover([_relative(p) for p in args.paths], config)
    outcomes, run = fix_files(files, config, unsafe=args.unsafe_fixes, write=not args.diff_fixes,
                              jobs=args.jobs or os.cpu_count(), diff_ref=args.diff)
    applied = sum(len(o.applied) for o in outcomes if o.changed)
    changed = [o for o in outcomes if o.changed]
    # what changed goes to stderr: stdout stays the report (or the diff), parseable in every format
    for outcome in outcomes:
        for finding, why in outcome.refused:
            print(f"{finding.path}:{_where(finding)}: {finding.rule} fix not applied: the result would not parse "
                  f"({why})", file=sys.stderr)
    if args.diff_fixes:
        for outcome in changed:
            sys.stdout.write(outcome.diff())
        print(f"Would fix {applied} finding{'s' if applied != 1 else ''} in {len(changed)} "
              f"file{'s' if len(changed) != 1 else ''}", file=sys.stderr)
    else:
        for outcome in changed:
            for finding in sorted(outcome.applied, key=lambda f: f.sort_key):
                print(f"fixed {finding.path}:{_where(finding)}: {finding.rule} {finding.slug}", file=sys.stderr)
        print(f"Fixed {applied} finding{'s' if applied != 1 else ''} in {len(changed)} "
              f"file{'s' if len(changed) != 1 else ''}; {len(run.findings)} remaining", file=sys.stderr)
    unsafe = unsafe_fixes_left(run)
    if unsafe and not args.unsafe_fixes:
        print(f"{unsafe} more fix{'es' if unsafe != 1 else ''} available with --unsafe-fixes (they change behaviour: "
              "review them)", file=sys.stderr)
    if args.diff_fixes:
        return EXIT_FINDINGS if changed else EXIT_OK  # as ruff --diff: 1 when there is something to apply
    if changed_lines is not None:
        run.errors = _changed_files_errors(run.errors, changed_lines, args.diff)
    color = {"always": True, "never": False}.get(args.color)
    render(run, args.format, sys.stdout, color=color)
    unanalyzed = [e for e in run.errors if e.unanalyzed]
    if unanalyzed and config.fail_on_errors and not args.exit_zero_on_errors:
        return EXIT_FINDINGS
    return EXIT_FINDINGS if fails(run.findings, config.fail_on) else EXIT_OK


def _where(finding) -> str:
    return f"cell {finding.cell}, line {finding.line}" if finding.cell else f"{finding.line}:{finding.column}"


# ---- the results cache and the language server ----------------------------------------------------


def _add_cache_arguments(check: argparse.ArgumentParser) -> None:
    check.add_argument("--no-cache", action="store_true",
                       help="analyze every file again, neither reading nor writing the results cache")
    check.add_argument("--cache-dir", metavar="DIR",
                       help="where the results cache lives (default: .torchreview_cache at the repository root)")


def cmd_feedback(args: argparse.Namespace) -> int:
    """What became of the App's comments, per installation and rule: a table, or JSON."""
    from bot.feedback import REPORT_COLUMNS, report

    rows = report(_app_store(), repository=args.repository, installation=args.installation)
    if args.format == "json":
        json.dump({"rows": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    headers = {"posted": "posted", "thumbs_down": "👎", "false_positive": "false-positive",
               "resolved_by_fix": "resolved by a fix", "resolved_without_fix": "resolved without a fix"}
    table = Table(title="torchreview comments and what became of them")
    table.add_column("installation")
    table.add_column("rule")
    for column in REPORT_COLUMNS:
        table.add_column(headers[column], justify="right")
    for row in rows:
        table.add_row("?" if row["installation"] is None else str(row["installation"]), row["rule"],
                      *(str(row[column]) for column in REPORT_COLUMNS))
    console = Console(width=200 if not sys.stdout.isatty() else None)
    if rows:
        console.print(table)
    else:
        console.print("No comments recorded yet" + (f" for {args.repository}" if args.repository else "") + ".")
    return EXIT_OK


def _app_store():
    from bot.settings import Settings
    from bot.store import make_store

    settings = Settings.from_env(require_github=False, role="web")  # the store only: no key is read
    return make_store(settings.redis_url, settings.data_dir)


def cmd_feedback_export(args: argparse.Namespace) -> int:
    """Reviewers' verdicts (👎, /review false-positive) on the App's comments, per rule and repository."""
    from collections import Counter

    records = [r for r in _app_store().feedback() if args.repository in (None, r.get("repository"))]
    totals = Counter((r["repository"], r["rule"], r["kind"]) for r in records)
    json.dump({"records": records,
               "totals": [{"repository": repo, "rule": rule, "kind": kind, "count": n}
                          for (repo, rule, kind), n in sorted(totals.items())]}, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return EXIT_OK


def _add_cache_and_lsp_commands(sub) -> None:
    clean = sub.add_parser("clean", help="delete the results cache (.torchreview_cache at the repository root)")
    clean.add_argument("--cache-dir", metavar="DIR", help="the cache to delete, when not the default one")
    clean.set_defaults(handler=cmd_clean)

    lsp = sub.add_parser("lsp", help="run the language server (LSP over stdio) for editors",
                         description="A Language Server: the findings of `torchreview check` as diagnostics on "
                                     "open, change and save, and quick fixes for the mechanical ones.")
    lsp.add_argument("--debounce", type=float, default=0.3, metavar="SECONDS",
                     help="wait this long after the last change before analyzing (default 0.3)")
    lsp.set_defaults(handler=cmd_lsp)


def _cache_dir(args: argparse.Namespace) -> Path:
    from analyzers.cache import cache_root

    return Path(args.cache_dir) if args.cache_dir else cache_root(Path.cwd())


def _result_cache(args: argparse.Namespace):
    from analyzers.cache import ResultCache

    return None if args.no_cache else ResultCache.in_directory(_cache_dir(args))


def cmd_clean(args: argparse.Namespace) -> int:
    import shutil

    from analyzers.cache import CACHE_DIRNAME, FORMAT

    directory = _cache_dir(args)
    if not directory.exists():
        print(f"torchreview: no cache at {directory}", file=sys.stderr)
        return EXIT_OK
    if args.cache_dir and not (directory / f"v{FORMAT}").exists() and directory.name != CACHE_DIRNAME:
        # --cache-dir names a folder to delete: refuse one that does not look like a cache
        raise UsageError(f"{directory}: not a torchreview cache; nothing deleted")
    shutil.rmtree(directory)
    print(f"torchreview: deleted {directory}", file=sys.stderr)
    return EXIT_OK


def cmd_lsp(args: argparse.Namespace) -> int:
    try:
        from bot.lsp import serve
    except ImportError as exc:
        raise UsageError(f"the language server needs pygls, a dependency of torchreview: "
                         f"pip install torchreview ({exc})") from None
    serve(debounce=args.debounce)
    return EXIT_OK


def _relative(path: str) -> str:
    """Show paths relative to the working directory, as git does, so --diff can match them."""
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(Path.cwd().resolve()).as_posix() or "."
    except ValueError:
        return path


def cmd_rules(args: argparse.Namespace) -> int:
    """Every rule, grouped by category: id, slug, level and measured holdout precision, default severity,
    whether it has a fix, summary."""
    import json
    from itertools import groupby

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from analyzers import levels
    from analyzers.model import Category
    from analyzers.rules import all_rules

    order = {category: index for index, category in enumerate(Category)}
    rules = sorted(all_rules(), key=lambda r: (order[r.category], r.id))
    if args.format == "json":
        print(json.dumps([{"id": r.id, "slug": r.slug, "category": r.category.value,
                           "severity": levels.capped(r.id, r.severity).label, "level": levels.level_of(r.id),
                           "holdout": levels.entry(r.id)["holdout"], "fix": rule_fix(r), "summary": r.summary,
                           "requires": r.requires} for r in rules],
                         indent=2))
        return EXIT_OK
    console = Console()
    stable = sum(1 for r in rules if levels.level_of(r.id) == levels.STABLE)
    console.print(f"[bold]torchreview rules[/bold]: {len(rules)}, by category; {stable} stable (run by default), "
                  f"{len(rules) - stable} preview (`--preview` or `preview: true`; never fail a check). Holdout "
                  f"precision: TP / judged findings [95 % interval], docs/evaluation.md")
    for category, members in groupby(rules, key=lambda r: r.category):
        table = Table(title=category.title, title_justify="left", show_lines=False)
        for column in ("id", "slug", "level", "holdout precision", "severity", "fix", "summary"):
            table.add_column(column, overflow="fold")
        for r in members:
            table.add_row(r.id, r.slug, levels.level_of(r.id), _holdout_figure(levels.entry(r.id)["holdout"]),
                          levels.capped(r.id, r.severity).label, rule_fix(r) or "", r.summary)
        console.print(table)
    return EXIT_OK


def _holdout_figure(measure) -> str:
    if not measure or not measure["judged"]:
        return "–"
    low, high = measure["interval"]
    return f"{measure['precision']:.0%} [{low:.0%}, {high:.0%}] n={measure['judged']}"


def rule_fix(rule) -> Optional[str]:
    """``safe`` / ``unsafe`` when the rule offers a mechanical fix (its examples show one), else None."""
    from analyzers.rules.base import Invalid

    if not any(isinstance(example, Invalid) and example.fixed for example in rule.INVALID):
        return None
    return getattr(rule, "fix_safety", "safe")


def cmd_rule(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markdown import Markdown

    from analyzers.rules import get_rule

    rule = get_rule(args.rule_id)
    if rule is None:
        raise UsageError(f"no rule {args.rule_id!r}; `torchreview rules` lists them")
    console = Console()
    if console.is_terminal:
        console.print(Markdown(rule.docs()))
    else:
        sys.stdout.write(rule.docs())
    return EXIT_OK


def cmd_migrate_torchfix(args: argparse.Namespace) -> int:
    from bot.migrate_torchfix import MigrationError, migrate

    try:
        migration = migrate(Path(args.path))
    except MigrationError as exc:
        raise UsageError(str(exc)) from None
    sys.stdout.write(migration.diff())
    for note in migration.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.write:
        migration.write()
        print(f"wrote {', '.join(sorted(migration.files))}", file=sys.stderr)
    elif migration.files:
        print("(nothing written: run again with --write to apply)", file=sys.stderr)
    return EXIT_OK


def _settings(role: str = "all"):
    from bot.settings import Settings, SettingsError

    try:
        return Settings.from_env(role=role)
    except SettingsError as exc:
        raise UsageError(str(exc)) from None


def _embedded() -> bool:
    """No REDIS_URL: `serve` runs the workers too, so it needs the private key as well."""
    return not os.environ.get("REDIS_URL", "").strip()


def _log_level() -> str:
    return os.environ.get("LOG_LEVEL", "INFO").upper()


def worker_command(concurrency: int, queues: str, beat: bool = False) -> list[str]:
    command = [sys.executable, "-m", "celery", "-A", "bot.tasks:celery_app", "worker", f"--loglevel={_log_level()}",
               f"--concurrency={concurrency}", "-Q", queues, "--without-gossip", "--without-mingle",
               "--without-heartbeat"]
    if beat:  # the schedule in memory: no file to share or leave behind (an interval needs no history)
        command += ["--beat", "--scheduler=celery.beat:Scheduler"]
    return command


def beat_command() -> list[str]:
    """The schedule (the delivery sweep) as a process of its own: `serve` supervises it like the workers. Embedded
    in a worker (``--beat``), it is a child that outlives a killed worker, and a restarted one starts another."""
    return [sys.executable, "-m", "celery", "-A", "bot.tasks:celery_app", "beat", f"--loglevel={_log_level()}",
            "--scheduler=celery.beat:Scheduler"]


WEB_THREADS = 8


def web_command(host: str, port: int, workers: int, internal_port: Optional[int] = None) -> list[str]:
    # gthread: a client that sends its request slowly holds one thread, not a whole worker process, and
    # for a few seconds at most (bot.gunicorn_conf.DeadlineThreadWorker).
    # internal_port: a second listener, where alone /healthz and /metrics answer (bot.webhook)
    binds = [f"{host}:{port}"] + ([f"{host}:{internal_port}"] if internal_port else [])
    return [sys.executable, "-m", "gunicorn", "--config", "python:bot.gunicorn_conf",
            *(argument for bind in binds for argument in ("--bind", bind)),
            "--workers", str(workers), "--worker-class", "bot.gunicorn_conf.DeadlineThreadWorker",
            "--threads", str(WEB_THREADS),
            "--access-logfile", "-", "--log-level", _log_level().lower(), "--graceful-timeout", "10",
            "bot.webhook:create_app()"]


def _metrics_env() -> tuple[dict, Optional[str]]:
    """The environment for serve's children: one metrics directory for all of them, emptied now."""
    import tempfile

    from bot.worker_metrics import MULTIPROC_ENV, clear_multiproc_dir

    given = os.environ.get(MULTIPROC_ENV)
    path = given or tempfile.mkdtemp(prefix="torchreview-metrics-")
    clear_multiproc_dir(path)
    return {**os.environ, MULTIPROC_ENV: path}, (None if given else path)


def cmd_serve(args: argparse.Namespace) -> int:
    import shutil
    import signal

    from bot import health
    from bot.jobs import declare_queues
    from bot.supervise import GaveUp, Supervisor
    from bot.worker_metrics import PORT_ENV

    settings = _settings("all" if _embedded() else "web")
    port = args.port or settings.port
    supervisor = Supervisor()
    env, owned_metrics_dir = _metrics_env()

    def stop(signum, _frame):
        raise SystemExit(128 + signum)  # runs the cleanup below; as PID 1 SIGTERM is otherwise ignored

    signal.signal(signal.SIGTERM, stop)
    try:
        if settings.embedded:
            print(f"torchreview: embedded mode (no REDIS_URL): broker and state in {settings.data_dir}/; "
                  "starting a worker alongside the web server", file=sys.stderr)
            declare_queues(settings)  # before any child sends or consumes: no two of them insert a queue row
            workers_dir = settings.data_dir / "workers"
            workers_dir.mkdir(parents=True, exist_ok=True)
            # The embedded workers share the web's metrics directory: its /metrics shows them too.
            worker_env = {**env, PORT_ENV: "0", health.WORKERS_DIR_ENV: str(workers_dir)}
            # smoke training on a worker of its own, so static reviews never wait behind it
            workers = {"reviews": worker_command(args.concurrency, "reviews"), "gpu": worker_command(1, "gpu")}
            for name, command in workers.items():
                health.pid_file(workers_dir, name).unlink(missing_ok=True)  # a previous serve's
                supervisor.add(name, command, {**worker_env, health.WORKER_NAME_ENV: name},
                               on_exit=lambda name=name: health.pid_file(workers_dir, name).unlink(missing_ok=True))
            supervisor.add("beat", beat_command(), worker_env)  # the delivery sweep runs on one machine too
            # /healthz fails while one of them is not running and consuming
            env = {**env, health.WORKERS_DIR_ENV: str(workers_dir), health.REQUIRED_WORKERS_ENV: ",".join(workers)}
        supervisor.add("web", web_command(args.host, port, args.web_workers, settings.internal_port), env)
        print(f"torchreview: webhook on http://{args.host}:{port}{settings.webhook_path}", file=sys.stderr)
        if settings.internal_port:
            print(f"torchreview: /healthz and /metrics on port {settings.internal_port} only", file=sys.stderr)
        supervisor.run()
    except GaveUp as exc:
        print(f"torchreview: {exc}", file=sys.stderr)
        return 1
    finally:
        supervisor.stop()
        if owned_metrics_dir:
            shutil.rmtree(owned_metrics_dir, ignore_errors=True)
    return EXIT_OK  # pragma: no cover - run() returns only by an exception


def cmd_worker(args: argparse.Namespace) -> int:
    from bot.worker_metrics import MULTIPROC_ENV, PORT_ENV, clear_multiproc_dir

    if args.metrics_port is not None:
        os.environ[PORT_ENV] = str(args.metrics_port)
    settings = _settings("worker")  # checks the metrics port too
    if os.environ.get(MULTIPROC_ENV):  # the operator's own directory: emptied at start, as prometheus-client asks
        clear_multiproc_dir(os.environ[MULTIPROC_ENV])
    if settings.embedded:
        from bot.jobs import declare_queues

        print(f"torchreview: no REDIS_URL: using the embedded broker in {settings.data_dir}/ "
              "(only workers on this machine share it)", file=sys.stderr)
        declare_queues(settings)
    os.execv(sys.executable, worker_command(args.concurrency, args.queues, beat=args.beat))
    return EXIT_OK  # pragma: no cover - execv does not return


def cmd_recover(args: argparse.Namespace) -> int:
    from datetime import datetime, timezone

    from github import GithubException
    from requests import RequestException

    from bot.github_client import GitHubClients
    from bot.recover import DurationError, parse_duration, sweep
    from bot.store import make_store

    try:
        window = parse_duration(args.since)
    except DurationError as exc:
        raise UsageError(f"--since: {exc}") from None
    settings = _settings("worker")  # the App's key signs the JWT these endpoints need
    store = make_store(settings.redis_url, settings.data_dir)
    try:
        report = sweep(GitHubClients(settings).integration.requester, store, datetime.now(timezone.utc) - window)
    except (GithubException, RequestException) as exc:  # listing failed: nothing was redelivered
        message = exc.data.get("message") if isinstance(getattr(exc, "data", None), dict) else None
        print(f"torchreview: error: cannot list the App's webhook deliveries at {settings.api_url}: "
              f"{getattr(exc, 'status', '')} {message or exc}".replace("  ", " "), file=sys.stderr)
        return EXIT_FINDINGS
    print(f"torchreview recover --since {args.since}: {report.summary()}")
    for guid in report.redelivered:
        print(f"redelivered {guid}")
    return EXIT_FINDINGS if report.errors else EXIT_OK


def cmd_smoke(args: argparse.Namespace) -> int:
    import json
    import subprocess
    import tempfile

    from bot.smoke import default_device, static_claims, with_claims
    from gpu_runner.runner import TargetRequest, smoke
    from gpu_runner.sandbox import SandboxLimits
    from analyzers.config import ConfigError, find_config, load_config_file
    from gpu_runner.runner import configured_requests
    from gpu_runner.targets import find_step_targets, find_targets

    if args.steps < 1:
        raise UsageError("--steps must be at least 1")
    if args.target is None and not args.config:
        raise UsageError("name a PATH[:Class] to smoke, or a --config whose smoke.targets / smoke.steps list them")
    path, _, name = (args.target or args.config).partition(":") if args.target else (args.config, "", "")
    file = Path(path).resolve()
    if not file.exists():
        raise UsageError(f"{path}: no such file")
    if args.target is not None and (not file.is_file() or file.suffix != ".py"):
        raise UsageError(f"{path}: not a Python file")
    try:
        root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=file.parent, capture_output=True,
                                   text=True, check=True).stdout.strip())
    except (subprocess.CalledProcessError, FileNotFoundError):
        if args.base:
            raise UsageError("--base needs the file to be inside a git repository") from None
        root = file.parent.parent if args.target is None and file.parent.name == ".github" else file.parent
    try:
        config = load_config_file(Path(args.config)) if args.config else find_config(file.parent)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    configured = configured_requests(dict(config.smoke))
    if args.target is None:
        requests_ = configured
        if not requests_:
            raise UsageError(f"{args.config}: smoke.targets and smoke.steps are empty; name a PATH[:Class]")
    else:
        relative = file.relative_to(root).as_posix()
        source = file.read_text(errors="replace")
        # the configuration's entries for this file say how to build them
        options = {(r.kind, r.target): r for r in configured if r.target.split(":", 1)[0] == relative}
        if name:
            _check_defined(path, source, name.split(".")[0])
            steps = {t.name: t for t in find_step_targets({relative: source}, {relative: None})}
            kind = "step" if name in steps or ("step", f"{relative}:{name}") in options else "model"
            line = steps[name].line if name in steps else 1
            requests_ = [TargetRequest(f"{relative}:{name}", line, kind=kind)]
        else:
            found = find_targets({relative: source}, {relative: None})
            found += find_step_targets({relative: source}, {relative: None})
            requests_ = [TargetRequest(f"{t.path}:{t.name}", t.line, kind="step" if t.kind == "step" else "model")
                         for t in found]
            requests_ += [r for key, r in options.items() if key not in {(q.kind, q.target) for q in requests_}]
            if not requests_:
                raise UsageError(f"{path}: defines no nn.Module subclass or training step; name a factory with "
                                 f"{path}:build_model")
        for request in requests_:
            match = options.get((request.kind, request.target))
            if match is not None:
                request.config = match.config
    # the static findings of the targets' files that a run can decide: the runner confirms or refutes each
    sources = {path: (root / path).read_text(errors="replace") for path in
               {r.target.split(":", 1)[0] for r in requests_} if (root / path).is_file()}
    claims = static_claims(sources, config, root)
    with_claims(requests_, claims)
    with tempfile.TemporaryDirectory(prefix="torchreview-base-") as base_dir:
        base = None
        if args.base:
            archive = subprocess.run(["git", "archive", "--format=tar", args.base], cwd=root, capture_output=True)
            if archive.returncode != 0:
                raise UsageError(f"--base {args.base}: {archive.stderr.decode(errors='replace').strip()}")
            subprocess.run(["tar", "-x", "-C", base_dir], input=archive.stdout, check=True)
            base = Path(base_dir)
        run = smoke(root, requests_, base_dir=base, device=default_device(args.device), steps=args.steps,
                    limits=SandboxLimits(timeout_s=args.timeout))
    if args.format == "json":
        print(json.dumps(run.to_dict(), indent=2, default=str))
    else:
        _print_smoke(run, claims)
    return EXIT_FINDINGS if run.failed else EXIT_OK


def _check_defined(path: str, source: str, name: str) -> None:
    """``FILE:Name`` must name a class or function the file defines at the top level."""
    import ast

    if not name.isidentifier():
        return  # not a plain top-level name: the runner resolves it and says what is wrong
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return  # the runner reports why it cannot import the file
    defined = {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
    defined |= {target.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for target in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(target, ast.Name)}
    defined |= {(alias.asname or alias.name).split(".")[0] for node in tree.body
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    if name in defined:
        return
    from gpu_runner.targets import find_targets

    classes = [t.name for t in find_targets({path: source}, {path: None})]
    found = f"nn.Module classes in it: {', '.join(classes)}" if classes else "it defines no nn.Module class"
    raise UsageError(f"{path}: no class or function {name!r}; {found}")


def _print_smoke(run, claims: Optional[dict] = None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    for warning in run.warnings:
        console.print(f"[yellow]sandbox:[/] {warning}")
    for outcome in run.outcomes:
        head = outcome.head
        colour = {"passed": "green", "failed": "red", "skipped": "yellow"}.get(outcome.status, "red")
        reason = escape(head.get("reason", ""))
        console.print(f"[bold]{escape(outcome.target)}[/]: [{colour}]{outcome.status}[/] {reason}")
        if head.get("checks"):
            table = Table(show_header=True, header_style="bold")
            for column in ("check", "result", "message"):
                table.add_column(column, overflow="fold")
            for check in head["checks"]:
                style = {"pass": "green", "fail": "red", "warn": "yellow"}.get(check["status"], "dim")
                table.add_row(check["name"], f"[{style}]{check['status']}[/]", escape(check["message"]))
            console.print(table)
        measures = head.get("measures") or {}
        if measures:
            console.print(f"  params {measures.get('params', 0):,} · step {measures.get('step_time_ms', 0):.2f} ms · "
                          f"peak memory {(measures.get('peak_memory_bytes') or 0) / (1 << 20):.0f} MiB · "
                          f"loss after steps {measures.get('loss_after_steps')}")
        for row in outcome.comparison:
            flag = "[red]regression[/] " if row.get("regression") else ""
            console.print(f"  vs base: {flag}{row['measure']} {row['change']} (head {row['head']}, base {row['base']})")
    from bot.smoke import VERDICT_WORDS, target_verdicts

    for target, claim, verdict in target_verdicts(run.to_dict(), claims or {}):
        style = {"confirmed": "red", "refuted": "green"}.get(verdict["verdict"], "dim")
        where = escape(f"{claim['path']}:{claim['line']}")
        console.print(f"[{style}]{VERDICT_WORDS[verdict['verdict']]}[/]: {claim['rule']} {claim['slug']} at {where} "
                      f"(on {escape(target['target'])}): {escape(verdict['evidence'])}")
    console.print(f"{len(run.outcomes)} target(s) on {run.device} in {run.seconds:.1f}s")


def cmd_demo(args: argparse.Namespace) -> int:
    from bot.demo import run_demo

    return run_demo(keep=args.keep, part=args.part)


def _require_extras(command: str) -> None:
    """A command of an extra (serve: the App's) says which extra to install when this install lacks it."""
    from bot.extras import MissingExtra, require_for

    try:
        require_for(command)
    except MissingExtra as exc:
        raise UsageError(str(exc)) from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # what argparse does for a missing command, with the whole help instead of one line
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    try:
        _require_extras(args.command)
        return args.handler(args)
    except UsageError as exc:
        for line in str(exc).splitlines():  # a configuration error lists every problem, one a line
            print(f"torchreview: error: {line}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
