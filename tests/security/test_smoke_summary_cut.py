"""Issue 23 item 5: the smoke check run's summary is cut to GitHub's size on whole lines (bot.review.hard_cap,
as every other body), never inside a code span. A hostile model controls its checks' messages, so it can move
its text across the cut: at no position may PR text render as a link, an image, HTML or an @mention."""
from __future__ import annotations

from bot.review import MAX_MARKDOWN_CHARS
from bot.smoke import plan_smoke_check_run
from gpu_runner.runner import _sanitized
from tests.markdown_render import render

PAYLOAD = ("[Approve: logs at the build server](https:evil.example/login) ![](https:evil.example/p.png) "
           "@octo-org/maintainers <img src=x> https://evil.example/x ")
OURS = {"strong"}  # the summary's own bold words


def run_with(filler: int, pad_checks: int = 16) -> dict:
    """Two targets (each report within the runner's size bound) whose failing checks fill the summary past the
    limit; the last check has the payload in a code span and as prose, the span's closing backtick past the cut
    for some ``filler``."""
    pads = [{"name": f"c{i}", "status": "fail", "message": "x" * 3900} for i in range(pad_checks)]
    last = {"name": "last", "status": "fail", "message": "y" * filler + " `" + PAYLOAD + "z" * 600 + "` " + PAYLOAD}
    halves = {"models/a.py:Pad": pads[:pad_checks // 2], "models/net.py:Net": pads[pad_checks // 2:] + [last]}
    targets = []
    for name, checks in halves.items():
        report = _sanitized({"status": "failed", "checks": checks, "measures": {}}, name)
        kept = report["checks"][-1]["message"]  # within the runner's bound: not shortened past its 4000 characters
        assert len(report["checks"]) == len(checks) and kept[:4000] == checks[-1]["message"][:4000]
        targets.append({"target": name, "line": 1, "status": "failed", "head": report, "base": None,
                        "comparison": []})
    return {"device": "cpu", "seconds": 12.3, "warnings": [PAYLOAD], "refused": None, "targets": targets}


def assert_inert(summary: str) -> None:
    shown = render(summary)
    assert not shown.unsafe_tags - OURS, (sorted(shown.unsafe_tags), summary[-400:])
    assert not shown.mentions and not shown.autolinks, (shown.mentions, shown.autolinks)


def test_no_cut_position_turns_pr_text_into_markup():
    cut = 0
    for filler in range(0, 4000, 19):  # moves the payload's line across the size limit, a few characters at a time
        summary = plan_smoke_check_run(run_with(filler), "a" * 40).summary
        assert len(summary) <= MAX_MARKDOWN_CHARS
        if "truncated to fit" in summary:
            cut += 1
            assert "| `models/net.py:Net` | last" not in summary or summary.rstrip().endswith("size limit)")
        assert_inert(summary)
    assert cut, "no filler made the summary long enough to be cut"


def test_each_cut_of_a_long_summary_ends_on_a_line_of_ours():
    """Every size limit across the payload's rows: what remains is whole lines, each inert."""
    from bot.review import hard_cap

    full = plan_smoke_check_run(run_with(0, pad_checks=2), "a" * 40).summary
    for limit in range(200, len(full) + 1, 97):
        cut = hard_cap(full, limit)
        assert len(cut) <= limit
        kept = cut.split("\n\n… (truncated")[0]
        assert full.startswith(kept) and (kept == full or full[len(kept)] == "\n")
        assert_inert(cut)
