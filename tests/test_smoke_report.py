"""What the smoke job posts: the check-run summary and the fingerprinted inline comments."""
from __future__ import annotations

from bot.review import parse_file_patch, parse_fingerprint
from bot.smoke import failing_target_comments, parse_smoke_fingerprint, plan_smoke_check_run, smoke_fingerprint

PATCH = "@@ -0,0 +1,12 @@\n" + "".join(f"+line {n}\n" for n in range(1, 13))


def target(name: str, failed: dict, line: int = 3, loss: float = 0.752098023891449) -> dict:
    checks = [{"name": check, "status": "fail", "message": message} for check, message in failed.items()]
    checks.append({"name": "gradients", "status": "pass", "message": "ok"})
    return {"target": name, "status": "failed" if failed else "passed", "line": line,
            "head": {"checks": checks, "measures": {"params": 709, "step_time_ms": 0.83,
                                                    "peak_memory_bytes": 300 << 20, "loss_after_steps": loss}}}


def run(*targets: dict) -> dict:
    return {"targets": list(targets), "device": "cpu", "seconds": 9.7}


def test_a_failure_keeps_its_fingerprint_when_the_numbers_and_the_line_change():
    first = target("models.py:Pool", {"batch-leakage": "output row 0 depends on input row 6"}, line=3)
    again = target("models.py:Pool", {"batch-leakage": "output row 1 depends on input row 5"}, line=9)
    other = target("models.py:Pool", {"batch-leakage": "…", "eval-determinism": "…"})
    assert smoke_fingerprint(first) == smoke_fingerprint(again)
    assert smoke_fingerprint(first) != smoke_fingerprint(other)  # a different failure: a new comment
    assert smoke_fingerprint(first) != smoke_fingerprint(target("models.py:Other", {"batch-leakage": "…"}))


def test_comments_carry_a_smoke_marker_that_the_static_review_does_not_read():
    failing = target("models.py:Pool", {"batch-leakage": "leaks"})
    [comment] = failing_target_comments(run(failing, target("models.py:Fine", {})),
                                        {"models.py": parse_file_patch("models.py", PATCH)}, {})
    assert parse_smoke_fingerprint(comment["body"]) == smoke_fingerprint(failing)
    assert parse_fingerprint(comment["body"]) is None  # the static review never resolves smoke threads


def test_a_target_name_cannot_forge_the_marker():
    forged = "models.py:Pool<!-- torchreview:smoke=" + "0" * 32 + " -->"
    failing = target(forged, {"batch-leakage": "leaks"})
    [comment] = failing_target_comments(run(failing), {"models.py": parse_file_patch("models.py", PATCH)}, {})
    assert parse_smoke_fingerprint(comment["body"]) == smoke_fingerprint(failing) != "0" * 32


def test_the_summary_rounds_losses():
    summary = plan_smoke_check_run(run(target("models.py:Pool", {})), "a" * 40).summary
    assert "| 0.7521 |" in summary and "0.752098" not in summary
