"""Per-file diffs between two trees, in the shape GitHub's API reports them.

GitHub's `patch` field is a git unified diff without the `diff --git`/`---`/`+++`
headers: only `@@ -a,b +c,d @@` hunks with 3 lines of context. Binary files and
very large diffs carry no `patch`. Review comments may only target lines that
appear in a hunk, so each diff also keeps a row per patch line for that check.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
from dataclasses import dataclass, field

CONTEXT_LINES = 3
# git looks at the first 8000 bytes for a NUL to decide a file is binary.
BINARY_SNIFF_BYTES = 8000
# Above this many bytes of patch text GitHub drops `patch` from the file entry.
DEFAULT_PATCH_SIZE_LIMIT = 1_000_000
# git's default rename threshold is 50% similarity.
RENAME_SIMILARITY = 0.5
# Fuzzy rename detection is quadratic, so only try it on small change sets.
MAX_FUZZY_RENAME_CANDIDATES = 50
# Beyond this many changed lines a file diff falls back to difflib's heuristics.
MAX_MYERS_EDITS = 2000
NO_NEWLINE_MARKER = "\\ No newline at end of file"


def blob_sha(content: bytes) -> str:
    """The git object id of a blob, as GitHub reports it."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def is_binary(content: bytes) -> bool:
    return b"\0" in content[:BINARY_SNIFF_BYTES]


@dataclass(frozen=True)
class PatchRow:
    """One line of a patch: kind is '@' (hunk header), '+', '-', ' ' or '\\'."""

    kind: str
    text: str
    old_line: int | None
    new_line: int | None
    hunk: int


@dataclass
class FileDiff:
    filename: str
    status: str  # added | removed | modified | renamed
    old_content: bytes | None
    new_content: bytes | None
    previous_filename: str | None = None
    additions: int = 0
    deletions: int = 0
    patch: str | None = None
    rows: list[PatchRow] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return self.additions + self.deletions

    @property
    def sha(self) -> str:
        """Blob sha GitHub reports: the new blob, or the old one for removals."""
        content = self.new_content if self.new_content is not None else self.old_content
        return blob_sha(content or b"")

    def row_for_line(self, side: str, line: int) -> PatchRow | None:
        """The patch row a (side, line) comment anchors to, if it is in the diff."""
        for row in self.rows:
            if side == "RIGHT" and row.kind in "+ " and row.new_line == line:
                return row
            if side == "LEFT" and row.kind in "- " and row.old_line == line:
                return row
        return None

    def row_at_position(self, position: int) -> PatchRow | None:
        """Legacy `position`: 1 is the line below the first @@ header."""
        if 1 <= position < len(self.rows) and self.rows[position].kind in "+- ":
            return self.rows[position]
        return None

    def position_of(self, row: PatchRow) -> int:
        return self.rows.index(row)

    def diff_hunk_for(self, row: PatchRow) -> str:
        """Text GitHub returns as a comment's diff_hunk: hunk header up to the line."""
        end = self.rows.index(row)
        start = end
        while self.rows[start].kind != "@":
            start -= 1
        return "\n".join(r.text for r in self.rows[start : end + 1])


def _split_lines(content: bytes) -> list[str]:
    return content.decode("utf-8", errors="replace").splitlines(keepends=True)


def _hunk_range(start: int, length: int) -> str:
    # git/difflib convention: 1-based start, ",1" omitted, empty range names the line before.
    first = start + 1
    if length == 1:
        return f"{first}"
    if length == 0:
        first -= 1
    return f"{first},{length}"


def _myers_edit_script(old: list[str], new: list[str], max_edits: int) -> list[str] | None:
    """Myers' O(ND) shortest edit script as a list of '=', '-', '+' steps.

    Fast when few lines change, whatever the file size (difflib is quadratic on
    files with many repeated lines). Returns None past `max_edits` changes."""
    n, m = len(old), len(new)
    frontier = {1: 0}  # diagonal k -> furthest x reached
    history = []
    for edits in range(max_edits + 1):
        history.append(dict(frontier))
        for k in range(-edits, edits + 1, 2):
            down = k == -edits or (k != edits and frontier[k - 1] < frontier[k + 1])
            x = frontier[k + 1] if down else frontier[k - 1] + 1
            y = x - k
            while x < n and y < m and old[x] == new[y]:
                x, y = x + 1, y + 1
            frontier[k] = x
            if x >= n and y >= m:
                return _backtrack(history, n, m)
    return None


def _backtrack(history: list[dict[int, int]], x: int, y: int) -> list[str]:
    steps: list[str] = []
    for edits in range(len(history) - 1, -1, -1):
        frontier, k = history[edits], x - y
        down = k == -edits or (k != edits and frontier[k - 1] < frontier[k + 1])
        previous_k = k + 1 if down else k - 1
        previous_x = frontier[previous_k]
        previous_y = previous_x - previous_k
        while x > previous_x and y > previous_y:
            steps.append("=")
            x, y = x - 1, y - 1
        if edits > 0:
            steps.append("+" if down else "-")
        x, y = previous_x, previous_y
    return steps[::-1]


def _opcodes(old: list[str], new: list[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib-style opcodes; each run of changes becomes one block (all '-' before '+', like git)."""
    steps = _myers_edit_script(old, new, MAX_MYERS_EDITS)
    if steps is None:  # a near-total rewrite: difflib's junk heuristic keeps it tractable
        return difflib.SequenceMatcher(None, old, new, autojunk=True).get_opcodes()
    opcodes: list[tuple[str, int, int, int, int]] = []
    i = j = 0
    for is_equal, run in itertools.groupby(steps, key=lambda step: step == "="):
        run = list(run)
        removed, added = run.count("-"), run.count("+")
        if is_equal:
            opcodes.append(("equal", i, i + len(run), j, j + len(run)))
            i, j = i + len(run), j + len(run)
            continue
        tag = "replace" if removed and added else "delete" if removed else "insert"
        opcodes.append((tag, i, i + removed, j, j + added))
        i, j = i + removed, j + added
    return opcodes


class _PrecomputedMatcher(difflib.SequenceMatcher):
    """Reuses difflib's hunk grouping on opcodes computed elsewhere."""

    def __init__(self, opcodes: list[tuple[str, int, int, int, int]]) -> None:
        super().__init__(None, [], [])
        self._precomputed = opcodes

    def get_opcodes(self) -> list[tuple[str, int, int, int, int]]:
        return list(self._precomputed) or [("equal", 0, 0, 0, 0)]


def build_patch(old: list[str], new: list[str]) -> tuple[list[PatchRow], int, int]:
    """Hunks of a unified diff as rows, plus (additions, deletions)."""
    rows: list[PatchRow] = []
    additions = deletions = 0
    matcher = _PrecomputedMatcher(_opcodes(old, new))

    def emit(kind: str, line: str, old_no: int | None, new_no: int | None, hunk: int) -> None:
        rows.append(PatchRow(kind, kind + line.rstrip("\r\n"), old_no, new_no, hunk))
        if not line.endswith("\n"):
            rows.append(PatchRow("\\", NO_NEWLINE_MARKER, None, None, hunk))

    for hunk, group in enumerate(matcher.get_grouped_opcodes(CONTEXT_LINES)):
        first, last = group[0], group[-1]
        header = (
            f"@@ -{_hunk_range(first[1], last[2] - first[1])} "
            f"+{_hunk_range(first[3], last[4] - first[3])} @@"
        )
        rows.append(PatchRow("@", header, None, None, hunk))
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                for offset in range(i2 - i1):
                    emit(" ", old[i1 + offset], i1 + offset + 1, j1 + offset + 1, hunk)
                continue
            for i in range(i1, i2):
                emit("-", old[i], i + 1, None, hunk)
                deletions += 1
            for j in range(j1, j2):
                emit("+", new[j], None, j + 1, hunk)
                additions += 1
    return rows, additions, deletions


def _fill_patch(diff: FileDiff, patch_size_limit: int) -> FileDiff:
    old, new = diff.old_content or b"", diff.new_content or b""
    if is_binary(old) or is_binary(new):
        return diff  # GitHub: no patch, zero additions/deletions for binary files
    rows, diff.additions, diff.deletions = build_patch(_split_lines(old), _split_lines(new))
    if not rows:
        return diff
    patch = "\n".join(row.text for row in rows)
    if len(patch) <= patch_size_limit:
        diff.patch, diff.rows = patch, rows
    return diff


def _similarity(old: bytes, new: bytes) -> float:
    if is_binary(old) or is_binary(new):
        return 0.0
    return difflib.SequenceMatcher(None, _split_lines(old), _split_lines(new), autojunk=False).ratio()


def _detect_renames(removed: dict[str, bytes], added: dict[str, bytes]) -> dict[str, str]:
    """Map new path -> old path for files git would report as renamed."""
    renames: dict[str, str] = {}
    by_content = {content: path for path, content in removed.items()}
    for path, content in added.items():
        if content in by_content and by_content[content] in removed:
            renames[path] = by_content.pop(content)
    unmatched_old = [p for p in removed if p not in renames.values()]
    unmatched_new = [p for p in added if p not in renames]
    if len(unmatched_old) * len(unmatched_new) > MAX_FUZZY_RENAME_CANDIDATES**2:
        return renames
    for new_path in unmatched_new:
        best, best_score = None, RENAME_SIMILARITY
        for old_path in unmatched_old:
            score = _similarity(removed[old_path], added[new_path])
            if score >= best_score:
                best, best_score = old_path, score
        if best is not None:
            renames[new_path] = best
            unmatched_old.remove(best)
    return renames


def diff_trees(
    old_tree: dict[str, bytes],
    new_tree: dict[str, bytes],
    patch_size_limit: int = DEFAULT_PATCH_SIZE_LIMIT,
) -> list[FileDiff]:
    """Changed files between two {path: content} trees, sorted by path like GitHub."""
    removed = {p: c for p, c in old_tree.items() if p not in new_tree}
    added = {p: c for p, c in new_tree.items() if p not in old_tree}
    renames = _detect_renames(removed, added)
    renamed_from = set(renames.values())

    diffs: list[FileDiff] = []
    for path in sorted(set(old_tree) | set(new_tree)):
        if path in renamed_from:
            continue
        if path in renames:
            source = renames[path]
            diff = FileDiff(path, "renamed", old_tree[source], new_tree[path], previous_filename=source)
        elif path in added:
            diff = FileDiff(path, "added", None, new_tree[path])
        elif path in removed:
            diff = FileDiff(path, "removed", old_tree[path], None)
        elif old_tree[path] != new_tree[path]:
            diff = FileDiff(path, "modified", old_tree[path], new_tree[path])
        else:
            continue
        diffs.append(_fill_patch(diff, patch_size_limit))
    return diffs
