"""The ``torchreview / smoke`` check: fetch head and base as data, smoke-train the changed modules in the
sandbox, and report a second check run plus inline comments on failing targets.

The worker holds the GitHub token; the sandboxed children get only directories of code.
"""
from __future__ import annotations

import hashlib
import io
import logging
import re
import shutil
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Optional

import requests

from analyzers.markdown import code_span, literal, message, redact_urls, table_cell
from bot.commands import ALLOWED_PERMISSIONS, MAINTAINER_PERMISSIONS, may_run, permission_level
from bot.jobs import SMOKE_CHECK_NAME, SmokeJob
from bot.review import CheckRunPlan, hard_cap
from bot.store import held_lock

log = logging.getLogger("torchreview.smoke")

# smoke.trust -> the PR author's roles (asked from GitHub, never the association) for automatic runs
TRUSTED = {
    "collaborators": ALLOWED_PERMISSIONS,  # write, maintain, admin
    "maintainers": MAINTAINER_PERMISSIONS,  # maintain, admin
    "everyone": None,  # any author, but still never a fork automatically
}
STATUS_BADGE = {"passed": "✅ passed", "failed": "❌ failed", "skipped": "⏭️ skipped", "error": "⚠️ error"}
MAX_TARBALL_BYTES = 200 << 20  # downloaded (compressed)
MAX_EXTRACTED_BYTES = 1 << 30  # unpacked: a 1.5 MiB tarball can hold 1.5 GiB of zeros
MAX_EXTRACTED_MEMBERS = 50_000
MAX_TAR_HEADER_BYTES = 64 << 10  # a GNU long name or a pax header: a path is at most 4 KiB
# What one smoke run keeps in Redis (for its retries, a day): its targets (smoke.max_targets) times each target's
# bounded report (gpu_runner.runner.MAX_REPORT_BYTES, head and base), plus the static claims; a larger one is not kept.
MAX_STORED_REPORT_BYTES = 3 << 20
MAX_LISTED_LEFT_OUT = 20
# Not the static review's fingerprint marker: each job resolves only the threads of its own kind.
SMOKE_MARKER_RE = re.compile(r"<!-- torchreview:smoke=([0-9a-f]+) -->")


def may_run_automatically(repo, pr, smoke: dict) -> tuple[bool, str]:
    """The trust policy for runs nobody asked for: smoke.enabled, no forks, the author's permission."""
    if not smoke.get("enabled"):
        return False, "smoke.enabled is false"
    head_repo = pr.head.repo
    if head_repo is None or head_repo.full_name != pr.base.repo.full_name:
        return False, "pull requests from forks only run on `/review smoke` by a user with write access"
    allowed = TRUSTED.get(smoke.get("trust", "collaborators"), TRUSTED["collaborators"])
    if allowed is None:
        return True, ""
    level = permission_level(repo, pr.user.login)
    if level not in allowed:
        return False, (f"the author's permission is {level}; smoke.trust wants {'/'.join(sorted(allowed))} "
                       "(a user with write access can comment `/review smoke`)")
    return True, ""


def default_device(configured: str) -> str:
    if configured in ("cpu", "cuda"):
        return configured
    return "cuda" if any(Path("/dev").glob("nvidia[0-9]*")) else "cpu"


# ---- fetching code as data ---------------------------------------------------------------------


class TarballTooLarge(ValueError):
    """A repository tarball over the download or extraction caps (a tarball bomb, or a huge repo)."""


def download_tree(repo, ref: str, into: Path, *, max_download: int = MAX_TARBALL_BYTES,
                  max_bytes: int = MAX_EXTRACTED_BYTES, max_members: int = MAX_EXTRACTED_MEMBERS) -> Path:
    """The repository at ``ref`` from the tarball endpoint, extracted safely: regular files and
    directories only (no links, devices or escapes), at most ``max_bytes`` unpacked in at most
    ``max_members`` entries, checked from the headers before each file is written."""
    from bot.archives import download_archive

    data = download_archive(repo, "tarball", ref, max_download, TarballTooLarge)
    return unpack_tree(data, into, ref=ref, max_bytes=max_bytes, max_members=max_members)


class _CappedTarInfo(tarfile.TarInfo):
    """A member header that refuses what tarfile would otherwise read whole before returning any member: a GNU
    long name or pax header of the size it declares (768 MiB of one cost a worker as much), or a chain of GNU
    sparse maps (GitHub's tarballs hold neither a sparse file nor a path over 4 KiB)."""

    _EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                 tarfile.SOLARIS_XHDTYPE)

    def _proc_member(self, archive):
        if self.type in self._EXTENDED and self.size > MAX_TAR_HEADER_BYTES:
            raise TarballTooLarge(f"the tarball has a {self.size:,}-byte long name or pax header (the most taken "
                                  f"is {MAX_TAR_HEADER_BYTES:,})")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise TarballTooLarge("the tarball has a GNU sparse member, which no repository tarball holds")
        return super()._proc_member(archive)


def unpack_tree(data, into: Path, *, ref: str, max_bytes: int = MAX_EXTRACTED_BYTES,
                max_members: int = MAX_EXTRACTED_MEMBERS) -> Path:
    """A repository tarball (a file object of its gzip'd bytes) extracted under ``into``, as ``download_tree``
    says; every cap holds while the archive streams, before what it caps is read."""
    into.mkdir(parents=True, exist_ok=True)
    total = members = 0
    # Streaming mode: one pass, each member's header read just before its data, so the caps stop a
    # bomb before it is unpacked (or even decompressed) past them.
    with tarfile.open(fileobj=data, mode="r|gz", tarinfo=_CappedTarInfo) as archive:
        for member in archive:
            members += 1
            if members > max_members:
                raise TarballTooLarge(f"the repository tarball at {ref[:7]} has over {max_members} entries")
            parts = Path(member.name).parts
            if len(parts) < 2 or not (member.isfile() or member.isdir()) or member.issparse():
                continue  # the top-level folder itself, links, devices, sparse files
            total += member.size if member.isfile() else 0
            if total > max_bytes:
                raise TarballTooLarge(f"the repository at {ref[:7]} unpacks to over {max_bytes >> 20} MiB")
            member.name = str(Path(*parts[1:]))  # strip GitHub's "<owner>-<repo>-<sha>/" prefix
            archive.extract(member, into, filter="data")
    return into


# ---- static findings for the runner to confirm -------------------------------------------------

_FORWARD_RETURNS = re.compile(r"\b(\w+)\.forward returns (softmax|sigmoid)\(")  # TR401 / TR403's message
_PLAIN_CONTAINER = re.compile(r"^`self\.(\w+)` of `(\w+)`")  # TR302's message


def static_claims(sources: dict[str, str], config=None, root: Optional[Path] = None, *,
                  max_files: Optional[int] = None, max_bytes: Optional[int] = None) -> dict[str, list[dict]]:
    """Per file, the static findings (the engine run here, in the worker, on the head's files; ``root``, the head's
    tree, answers questions across files as in the static review) that a smoke run can decide
    (gpu_runner.confirm), as plain data for the sandboxed runner: rule, file, lines, the class the finding is in,
    and what the experiment needs from the message (the class whose forward returns the activation, the
    attribute holding the modules). Each claim keeps its finding's slug and message for the report; the runner
    sees only the experiment's fields.

    Bounded as the static review is: at most ``max_files`` files and ``max_bytes`` of source (the review's
    limits by default; the files past them give no claims), each analyzed in a forked child
    (analyzers.isolation) with its time and memory limits, so a file that crashes or stalls the parser, or a rule
    that fails, costs only that file's claims, never the smoke run."""
    from analyzers.config import Config
    from analyzers.program.modules import RepositoryIndex
    from analyzers.isolation import run_isolated
    from bot.pipeline import MAX_REVIEW_BYTES, MAX_REVIEW_FILES, app_file_seconds

    max_files = MAX_REVIEW_FILES if max_files is None else max_files
    max_bytes = MAX_REVIEW_BYTES if max_bytes is None else max_bytes
    # Every rule a run can decide, preview ones too: a run that confirms (or fails to reproduce) a preview rule's
    # finding is the evidence that rule needs; the report says what the run showed about each claim.
    config = replace(config or Config(), preview=True)
    try:
        index = RepositoryIndex(root) if root is not None else None
    except Exception:  # noqa: BLE001 - no context across files: each file on its own, as the review would
        log.warning("no repository context for the smoke run's static findings", exc_info=True)
        index = None
    picked, total = [], 0
    for path, source in sources.items():
        size = len(source.encode("utf-8", errors="replace"))
        if len(picked) >= max_files or total + size > max_bytes:
            continue
        picked.append((path, source))
        total += size

    def claims_of(path: str, source: str) -> list[dict]:
        try:
            return _file_claims(path, source, config, index)
        except Exception:  # noqa: BLE001 - a failing rule costs this file's claims, not the smoke run
            return []

    found = run_isolated(picked, claims_of, lambda path, kind, message: [], seconds=app_file_seconds(config))
    return {path: found[path] for path, _ in picked if found.get(path)}


def _file_claims(path: str, source: str, config, index) -> list[dict]:
    import ast

    from analyzers.engine import analyze_text
    from gpu_runner.runner import DECIDABLE_RULES

    findings = [f for f in analyze_text(source, path, config, repository=index).findings
                if f.rule in DECIDABLE_RULES]
    if not findings:
        return []
    try:
        classes = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    claims = []
    for finding in findings:
        around = [c for c in classes if c.lineno <= finding.line <= (c.end_lineno or c.lineno)]
        claim = {"rule": finding.rule, "path": path, "line": finding.line, "end_line": finding.end_line,
                 "class": max(around, key=lambda c: c.lineno).name if around else None,
                 "slug": finding.slug, "message": finding.message}
        forward = _FORWARD_RETURNS.search(finding.message)
        container = _PLAIN_CONTAINER.search(finding.message)
        if finding.rule in ("TR401", "TR403"):
            if forward is None:
                continue  # the activation is applied outside any model's forward: no model run decides it
            if finding.rule == "TR401" and "CrossEntropyLoss applies log_softmax" not in finding.message:
                continue  # probabilities into NLLLoss: a wrong loss, not a floor a run can show
            claim["forward_of"] = forward.group(1)
            claim["forward_path"] = _defining_file(forward.group(1), path, source, classes, index)
        if finding.rule == "TR302":
            if container is None:
                continue
            claim["attribute"], claim["class"] = container.group(1), container.group(2)
        claims.append(claim)
    return claims


def _defining_file(name: str, path: str, source: str, classes: list, index) -> Optional[str]:
    """The file (relative to the repository) defining the class ``name`` means in ``path``: the file itself, or
    the one it imports it from as the static engine resolves it; None when it cannot tell."""
    if any(node.name == name for node in classes):
        return path
    if index is None:
        return None
    found = index.find_class(index.root / path, name, source)
    if found is None:
        return None
    try:
        return Path(found.path).resolve().relative_to(index.root).as_posix()
    except ValueError:
        return None


RUNNER_CLAIM_KEYS = ("rule", "path", "line", "end_line", "class", "forward_of", "attribute")


def with_claims(requests_: list, claims: dict[str, list[dict]]) -> None:
    """Gives each step target the training-loop claims of its file; each model target the other claims of its
    file, and those that name its class's forward from another file
    (a training script feeding its softmax output to CrossEntropyLoss) when that class is this target's (the
    file the static engine resolved it to; by name only when it could not): what the runner needs of them,
    nothing of the PR's text beyond names."""
    from gpu_runner.runner import STEP_DECIDABLE_RULES

    for request in requests_:
        path, _, name = request.target.partition(":")
        if request.kind == "step":  # the training-loop claims of the step's file, decided while it runs
            mine = [c for c in claims.get(path, []) if c["rule"] in STEP_DECIDABLE_RULES]
        else:
            mine = [c for file, found in claims.items() for c in found if c["rule"] not in STEP_DECIDABLE_RULES and
                    (file == path or c.get("forward_of") and c.get("forward_of") == name
                     and c.get("forward_path") in (None, path))]
        request.findings = [{k: c[k] for k in RUNNER_CLAIM_KEYS if k in c} for c in mine]


VERDICT_MARK = "🔬"  # opens a verdict comment (a failing target's opens with 🔥)
VERDICT_WORDS = {"confirmed": "Confirmed by running", "refuted": "Not reproduced by running",
                 "undecided": "Not decided by running"}


def target_verdicts(run: dict, claims: dict[str, list[dict]]) -> list[tuple[dict, dict, dict]]:
    """(target, claim, verdict) for every static finding the run decided or tried to, one per finding: a
    confirmation by any target wins over a refutation, which wins over undecided."""
    rank = {"confirmed": 0, "refuted": 1, "undecided": 2}
    best: dict[tuple, tuple[dict, dict, dict]] = {}
    for target in run.get("targets", []):
        for verdict in target.get("head", {}).get("findings") or []:
            path = verdict.get("path") or target["target"].split(":", 1)[0]
            claim = next((c for c in claims.get(path, []) if c["rule"] == verdict.get("rule")
                          and c["line"] == verdict.get("line")), None)
            if claim is None:
                continue
            key = (path, claim["rule"], claim["line"])
            if key not in best or rank[verdict["verdict"]] < rank[best[key][2]["verdict"]]:
                best[key] = (target, claim, verdict)
    return [best[key] for key in sorted(best)]


def verdict_line(target: dict, claim: dict, verdict: dict) -> str:
    """One Markdown line: what the run says of a static finding, and its evidence."""
    where = f"{claim['path']}:{claim['line']}"
    return (f"**{VERDICT_WORDS[verdict['verdict']]}** ({literal(claim['rule'])} {literal(claim['slug'])} at "
            f"{code_span(where)}, on {code_span(target['target'])}): {_public(verdict['evidence'])}")


# ---- reporting ---------------------------------------------------------------------------------


def plan_smoke_check_run(run: dict, head_sha: str, claims: Optional[dict] = None) -> CheckRunPlan:
    if run.get("refused"):  # the runner would not run PR code without its sandbox: say why, run nothing
        return CheckRunPlan("neutral", "Smoke run refused: this runner cannot sandbox pull-request code",
                            "No code of this pull request was run. " + literal(run["refused"]) +
                            "\n\nThe operator of this torchreview installation must fix the runner: see the "
                            "docs/security.md of torchreview's repository.")
    targets = run["targets"]
    failing = [t for t in targets if t["status"] in ("failed", "error")]
    regressions = [(t, c) for t in targets for c in t.get("comparison", []) if c.get("regression")]
    skipped = [t for t in targets if t["status"] == "skipped"]
    if not targets:
        return CheckRunPlan("neutral", "No nn.Module changed", "This pull request adds or changes no `nn.Module`.")
    conclusion = "failure" if failing or regressions else ("neutral" if len(skipped) == len(targets) else "success")
    title = (f"{len(failing)} of {len(targets)} model(s) failed the smoke checks" if failing else
             f"{len(targets) - len(skipped)} model(s) passed" + (f", {len(skipped)} skipped" if skipped else ""))
    if regressions:
        title += f"; {len(regressions)} regression(s) against the base"
    lines = [f"Smoke-trained on **{run['device']}** at {head_sha[:7]} in {run['seconds']:.1f}s, each target in a "
             "sandboxed process (no network, no credentials, time and memory limits).", ""]
    left_out = run.get("left_out")
    if left_out:  # over smoke.max_targets: say which were not run, never silently, and pass no one untested
        title += f"; {left_out['count']} not run"
        conclusion = "neutral" if conclusion == "success" else conclusion
        named = ", ".join(code_span(t) for t in left_out["targets"])
        more = ", …" if left_out["count"] > len(left_out["targets"]) else ""
        lines += [f"⏭️ **{left_out['count']} more target(s) not smoke-trained**: a run trains at most "
                  f"{left_out['max_targets']} (`smoke.max_targets` in the base branch's configuration): {named}{more}", ""]
    lines += ["| target | check | result | head vs base |", "|---|---|---|---|"]
    for t in targets:
        name = table_cell(code_span(t["target"]))
        delta = table_cell(literal("; ".join(f"{c['measure']} {c['change']}" for c in t.get("comparison", [])))) or "—"
        if t["status"] in ("skipped", "error"):
            lines.append(f"| {name} | — | {STATUS_BADGE[t['status']]}: {table_cell(_reason(t))} | — |")
            continue
        checks = t["head"].get("checks", [])
        failed = [c for c in checks if c["status"] in ("fail", "warn")]
        passed = sum(1 for c in checks if c["status"] == "pass")
        for check in failed:  # reviewers act on failures: each gets its own row
            result = "❌" if check["status"] == "fail" else "⚠️"
            lines.append(f"| {name} | {table_cell(literal(check['name']))} | {result} "
                         f"{table_cell(_public(check['message']))} | {delta} |")
            delta = ""  # once per target
        skipped_checks = len(checks) - passed - len(failed)
        rest = f"✅ {passed} passed" + (f", {skipped_checks} not applicable" if skipped_checks else "")
        lines.append(f"| {name} | {'other checks' if failed else 'all checks'} | {rest} | {delta} |")
    for t, c in regressions:
        lines.append(f"\n⚠️ {code_span(t['target'])}: {_public(c['message'])}")
    measures = [t for t in targets if t["head"].get("measures")]
    if measures:
        lines += ["", "| target | parameters | step time | peak memory | loss after steps |", "|---|---|---|---|---|"]
        for t in measures:
            m = t["head"]["measures"]
            lines.append(f"| {table_cell(code_span(t['target']))} | {m.get('params', '—'):,} | {m.get('step_time_ms', 0):.2f} ms | "
                         f"{(m.get('peak_memory_bytes') or 0) / (1 << 20):.0f} MiB | {format_loss(m.get('loss_after_steps'))} |")
    verdicts = target_verdicts(run, claims or {})
    if verdicts:
        lines += ["", "**Static findings checked by running** (a finding not reproduced still stands: this run "
                      "only did not show it):"] + [f"- {verdict_line(*v)}" for v in verdicts]
    if run.get("stopped"):  # the operator's cap on the job's time: not every target had its turn
        lines += ["", f"⏱️ {_public(run['stopped'])}"]
    if run.get("warnings"):
        lines += ["", "**Sandbox warnings** (layers unavailable on this runner):"] + [f"- {_public(w)}" for w in run["warnings"]]
    # whole lines only, as the review's bodies: a raw cut could end inside a code span and make its PR text markup
    return CheckRunPlan(conclusion, title, hard_cap("\n".join(lines)))


def format_loss(value) -> str:
    """Four significant digits: enough to compare runs, unlike float32 noise such as 0.752098023891449."""
    return f"{value:.4g}" if isinstance(value, (int, float)) else "—"


def smoke_fingerprint(target: dict) -> str:
    """Identity of one target's failure: the target and which checks failed, not the messages (they
    quote measured numbers that vary between runs) nor the line (unrelated edits move it)."""
    failed = sorted(c["name"] for c in target["head"].get("checks", []) if c["status"] == "fail")
    key = "\0".join(["smoke", target["target"], target["status"], *failed])
    return hashlib.blake2b(key.encode("utf-8"), digest_size=16).hexdigest()


def parse_smoke_fingerprint(comment_body: str) -> Optional[str]:
    """The smoke fingerprint in one of our comment bodies; the last match, as quoted text comes first."""
    matches = SMOKE_MARKER_RE.findall(comment_body or "")
    return matches[-1] if matches else None


def failing_targets(run: dict) -> list[dict]:
    return [t for t in run["targets"] if t["status"] in ("failed", "error")]


def failing_target_comments(run: dict, diffs: dict, spans: dict) -> list[dict]:
    """Inline comments on the class of each failing target, on a line of the diff."""
    comments = []
    for t in failing_targets(run):
        path = t["target"].split(":", 1)[0]
        diff = diffs.get(path)
        start, end = spans.get(t["target"], (t.get("line", 1), t.get("line", 1)))
        if diff is None:
            continue
        failed = [c for c in t["head"].get("checks", []) if c["status"] == "fail"]
        # a training step's failure names its line (the missing zero_grad's step, the detached loss's backward)
        named = [c["details"]["line"] for c in failed if isinstance((c.get("details") or {}).get("line"), int)]
        line = next((n for n in named + list(range(start, end + 1)) if n in diff.commentable), None)
        if line is None:
            continue
        body = [f"🔥 **smoke** · {code_span(t['target'])} failed when trained for a few steps:", ""]
        body += [f"- **{literal(c['name'])}**: {_public(c['message'])}" for c in failed] or \
                [f"- {_reason(t) or 'error'}"]
        body += ["", f"<!-- torchreview:smoke={smoke_fingerprint(t)} -->"]
        comments.append({"path": path, "line": line, "side": "RIGHT", "body": "\n".join(body)})
    return comments


def verdict_fingerprint(target: dict, claim: dict, verdict: dict) -> str:
    """Identity of one verdict comment: the finding (file, rule, class, message) and the verdict, not the line."""
    key = "\0".join(["verdict", target["target"], claim["path"], claim["rule"], str(claim.get("class")),
                      claim["message"], verdict["verdict"]])
    return hashlib.blake2b(key.encode("utf-8"), digest_size=16).hexdigest()


def verdict_comments(run: dict, claims: dict, diffs: dict) -> list[dict]:
    """An inline comment on the line of each static finding the run confirmed or did not reproduce (not the
    undecided ones), where that line is in the diff."""
    comments = []
    for target, claim, verdict in target_verdicts(run, claims):
        path = claim["path"]
        diff = diffs.get(path)
        if verdict["verdict"] == "undecided" or diff is None or claim["line"] not in diff.commentable:
            continue
        body = [f"{VERDICT_MARK} **smoke** · {verdict_line(target, claim, verdict)}"]
        if verdict["verdict"] == "refuted":
            body += ["", "The static finding stands: this run, with this build of the model, only did not show it."]
        body += ["", f"<!-- torchreview:smoke={verdict_fingerprint(target, claim, verdict)} -->"]
        comments.append({"path": path, "line": claim["line"], "side": "RIGHT", "body": "\n".join(body)})
    return comments


def said_once(failures: list[dict], verdicts: list[dict]) -> list[dict]:
    """The comments of one smoke review, each line said once: a static finding the run confirmed on the very
    line a failure comment takes (a training step's missing zero_grad: the step's failure and TR101's
    confirmation are the same observation) is a line of that comment, not a second comment; the comment
    keeps the failure's fingerprint (its thread lives and is resolved with the failure)."""
    by_place = {(c["path"], c["line"]): c for c in failures}
    kept = []
    for verdict in verdicts:
        failure = by_place.get((verdict["path"], verdict["line"]))
        confirmed = verdict["body"].startswith(f"{VERDICT_MARK} **smoke** · **{VERDICT_WORDS['confirmed']}**")
        if failure is None or not confirmed:
            kept.append(verdict)
            continue
        said = verdict["body"].rsplit("\n\n", 1)[0].split(" · ", 1)[1]
        body, marker = failure["body"].rsplit("\n\n", 1)
        failure["body"] = f"{body}\n\n{said}\n\n{marker}"
    return failures + kept


def _reason(target: dict) -> str:
    return _public(target["head"].get("reason", ""))


def _public(text: str) -> str:
    """Runner text (it quotes the PR's code and exceptions, code marked with backticks) as Markdown."""
    return message(redact_urls(text))


# ---- the job -----------------------------------------------------------------------------------


class SmokeBusy(Exception):
    """Another worker is running this smoke job (a redelivery): try again later."""


def _job_key(job: SmokeJob) -> str:
    return f"torchreview:smoke:{job.repository}#{job.pull_number}:{job.head_sha}:{job.delivery}"


SMOKE_LOCK_TTL = 120  # renewed while the run lasts; a GPU worker lost mid-run frees it within two minutes


def run_smoke_job(job: SmokeJob, clients, store) -> str:
    """Idempotent: a job that already finished returns at once; a copy of a running one waits.
    Runs exactly ``job.head_sha`` (pinned when the run was authorized), on every retry."""
    key = _job_key(job)
    if store.exists(key + ":done"):
        return "already done"
    with held_lock(store, key + ":lock", SMOKE_LOCK_TTL) as token:
        if token is None:
            raise SmokeBusy()
        outcome = _run_smoke_job(job, clients, store)
        store.claim(key + ":done", 7 * 24 * 3600)
        return outcome


def _authorize(job: SmokeJob, repo, pr, settings: dict) -> str | None:
    """Why ``job`` may not execute PR code (None: it may). Never the association: GitHub's permission."""
    if job.reason == "smoke.auto":
        allowed, why = may_run_automatically(repo, pr, settings)
        if not allowed:
            return why
        if pr.head.sha != job.head_sha:
            return f"{job.head_sha[:7]} is no longer the head"  # the newer head's review enqueues its own run
        return None
    if job.reason == "command.smoke":
        return None  # the command job checked the commenter's permission and pinned this commit
    if job.reason.startswith("check_run."):
        # the re-run button of a smoke check run: the clicker needs write access; the commit is the
        # check run's own, which was authorized when it first ran
        if not may_run(repo, job.requested_by or ""):
            return f"{job.requested_by} has no write access"
        return None
    return f"unknown reason {job.reason!r}"


def _smoke_check_run(repo, job: SmokeJob, budget):
    """The in-progress check run of this job (a retry reuses the one its first attempt created)."""
    from bot.github_client import our_check_runs

    external_id = _job_key(job)[len("torchreview:smoke:"):]
    for run in our_check_runs(repo, job.head_sha, SMOKE_CHECK_NAME):
        if run.external_id == external_id and run.status != "completed":
            return run
    budget.spend()
    return repo.create_check_run(name=SMOKE_CHECK_NAME, head_sha=job.head_sha, status="in_progress",
                                 external_id=external_id,
                                 output={"title": "Smoke-training…", "summary": "Building and training the changed models."})


def fail_smoke_check_run(job: SmokeJob, clients, store, message: str) -> None:
    """The job failed for good: complete its check run instead of leaving it in progress (best effort)."""
    from bot.github_client import our_check_runs
    from bot.pipeline import complete_check_run
    from bot.review import job_failed_plan
    from bot.store import WriteBudget

    try:
        repo = clients.for_installation(job.installation_id, job.repository).get_repo(job.repository)
        external_id = _job_key(job)[len("torchreview:smoke:"):]
        for run in our_check_runs(repo, job.head_sha, SMOKE_CHECK_NAME):
            if run.external_id == external_id and run.status != "completed":
                complete_check_run(run, job_failed_plan(message), WriteBudget(store, job.installation_id))
    except Exception:  # noqa: BLE001 - best effort; the original error is what matters
        log.exception("could not mark the smoke check run failed")


def _run_smoke_job(job: SmokeJob, clients, store) -> str:
    import json

    from analyzers.config import ConfigError
    from bot.conversation import close_gone, our_review_comments
    from bot.github_client import classify, commit_ref
    from bot.jobs import config_commit
    from bot.pipeline import complete_check_run, load_base_config
    from bot.review import parse_file_patch
    from bot.store import WriteBudget, WriteBudgetSpent
    from gpu_runner.executor import run_smoke
    from gpu_runner.runner import TargetRequest, configured_requests
    from gpu_runner.sandbox import SandboxLimits
    from gpu_runner.targets import find_step_targets, find_targets, parse_target_spec

    gh = clients.for_installation(job.installation_id, job.repository)
    repo = gh.get_repo(job.repository)
    pr = repo.get_pull(job.pull_number)
    head = job.head_sha  # never re-read from the PR: a push after authorization must not run
    budget = WriteBudget(store, job.installation_id)
    try:
        config = load_base_config(repo, config_commit(store, job.repository, pr), store)
    except ConfigError as exc:
        return f"configuration error: {exc}"
    settings = dict(config.smoke)
    refused = _authorize(job, repo, pr, settings)
    if refused:
        return f"smoke not run: {refused}"
    check_run = _smoke_check_run(repo, job, budget)
    import importlib.util

    import os

    # With an executor service (gpu_runner.executor), torch lives there, not in this credentialed worker.
    if not os.environ.get("TORCHREVIEW_EXECUTOR_URL") and importlib.util.find_spec("torch") is None:
        complete_check_run(check_run, CheckRunPlan(
            "neutral", "No GPU runner on this installation",
            "This torchreview worker has no torch: install `torchreview[runner]` (torch first, pinned to your "
            "CUDA build) on the machines that run `torchreview worker --queues gpu`."), budget)
        return "smoke: no torch on this worker"
    report_key = _job_key(job) + ":report"
    workdir = Path(tempfile.mkdtemp(prefix="torchreview-smoke-"))
    try:
        # the diff of the pinned commit: the PR's file list when it is the head, else base...sha
        listing = pr.get_files() if head == pr.head.sha else repo.compare(pr.base.sha, head).files
        files = [f for f in listing if f.filename.endswith(".py") and f.status != "removed"]
        diffs = {f.filename: parse_file_patch(f.filename, f.patch) for f in files}
        cached = store.get(report_key)  # a retry after the training (e.g. for the write budget) reuses it
        if cached is not None:
            saved = json.loads(cached)
            report, spans = saved["report"], {k: tuple(v) for k, v in saved["spans"].items()}
            claims = saved.get("claims") or {}
        else:
            head_dir = download_tree(repo, head, workdir / "head")
            base_dir = download_tree(repo, pr.base.sha, workdir / "base")
            sources = {f.filename: (head_dir / f.filename).read_text(errors="replace") for f in files
                       if (head_dir / f.filename).is_file()}
            changed = {path: set(diff.added) for path, diff in diffs.items()}
            found = find_targets(sources, changed) + find_step_targets(sources, changed)
            spans = {f"{t.path}:{t.name}": (t.line, t.end_line) for t in found}
            requests_ = [TargetRequest(f"{t.path}:{t.name}", t.line,
                                       kind="step" if t.kind == "step" else "model") for t in found]
            configured = {(r.kind, r.target): r for r in configured_requests(settings)
                          if parse_target_spec(r.target) is not None}
            configured_keys = set(configured)
            for request in requests_:  # a changed target the config describes is built as configured
                request.config = configured.pop((request.kind, request.target), request).config
            requests_, left_out = within_target_limit(requests_ + list(configured.values()), configured_keys,
                                                      int(settings.get("max_targets", 16)))
            # The static findings of the same files that a run can decide: the engine runs here, on the head's
            # sources (not in the sandbox, which gets only the claims), with the base branch's configuration.
            claims = static_claims(sources, config, head_dir)
            with_claims(requests_, claims)
            limits = SandboxLimits(timeout_s=float(settings.get("timeout", 300)), memory_bytes=_memory_bytes(settings.get("memory")))
            report = run_smoke(head_dir, requests_, base_dir=base_dir, device=settings.get("device", "auto"),
                               limits=limits, thresholds=settings.get("regression"))
            if left_out:
                report["left_out"] = {"count": len(left_out), "targets": left_out[:MAX_LISTED_LEFT_OUT],
                                      "max_targets": int(settings.get("max_targets", 16))}
            keep_report(store, report_key, json.dumps({"report": report, "spans": spans, "claims": claims}))
        if job.reason == "smoke.auto":  # explicit runs report on the commit they were asked for
            current = repo.get_pull(pr.number).head.sha
            if current != head:
                from bot.review import superseded_plan

                complete_check_run(check_run, superseded_plan(head, current), budget)
                return f"smoke superseded by {current[:7]}"
        # Like the static review: a failure that already has a comment is not commented again, and the
        # threads of failures that are gone (fixed, or the model removed) are resolved per `cleanup`.
        existing = our_review_comments(pr, clients.bot_login(), parse=parse_smoke_fingerprint)
        comments = [c for c in said_once(failing_target_comments(report, diffs, spans),
                                         verdict_comments(report, claims, diffs))
                    if parse_smoke_fingerprint(c["body"]) not in existing] if head == pr.head.sha else []
        if comments:
            budget.spend()
            checked = sum(1 for c in comments if c["body"].startswith(VERDICT_MARK))
            failed = len(comments) - checked
            said = [f"{failed} model(s) failed when trained for a few steps"] * bool(failed)
            said += [f"{checked} static finding(s) checked by running"] * bool(checked)
            pr.create_review(commit=commit_ref(repo, head), event="COMMENT", comments=comments,
                             body=f"torchreview smoke: {'; '.join(said)}.")
        still_failing = {smoke_fingerprint(t) for t in failing_targets(report)}
        still_failing |= {verdict_fingerprint(*v) for v in target_verdicts(report, claims)}
        gone = [c for fingerprint, c in existing.items() if fingerprint not in still_failing]
        close_gone(gh, job.repository, pr, gone, config.cleanup, clients.bot_login(), budget.spend)
        plan = plan_smoke_check_run(report, head, claims)
        complete_check_run(check_run, plan, budget)
        return f"smoke: {plan.title}"
    except Exception as exc:
        if isinstance(exc, WriteBudgetSpent) or classify(exc, 0) is not None:
            raise  # retried: the check run stays in progress and the retry reuses it
        from bot.review import job_failed_plan

        complete_check_run(check_run, job_failed_plan(f"{type(exc).__name__}: {exc}"), budget)
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def keep_report(store, key: str, saved: str, max_bytes: int = MAX_STORED_REPORT_BYTES) -> bool:
    """Keep a run's report a day for its retries, unless it is over ``max_bytes``: never a dump in the Redis every
    installation's queue shares (a retry then trains again)."""
    if len(saved) > max_bytes:
        log.warning("smoke report %s is %d bytes, over %d: not kept for retries", key, len(saved), max_bytes)
        return False
    store.put(key, saved, 24 * 3600)
    return True


def within_target_limit(requests_: list, configured: set, max_targets: int) -> tuple[list, list[str]]:
    """At most ``max_targets`` of the run's targets, in the run's order, those the base's configuration names
    (``configured``: (kind, target) pairs) chosen first: a pull request adding many classes cannot push them out.
    The targets left out, by name, for the check run."""
    first = {id(r) for r in requests_ if (r.kind, r.target) in configured}
    chosen = {id(r) for r in ([r for r in requests_ if id(r) in first] +
                              [r for r in requests_ if id(r) not in first])[:max_targets]}
    return [r for r in requests_ if id(r) in chosen], [r.target for r in requests_ if id(r) not in chosen]


def _memory_bytes(value) -> int:
    if isinstance(value, int):
        return value << 20
    text = str(value or "4GiB").strip().lower()
    units = {"gib": 30, "gb": 30, "g": 30, "mib": 20, "mb": 20, "m": 20}
    for suffix, shift in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * (1 << shift))
    return int(text) << 20
