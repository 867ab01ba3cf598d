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


def verdict_target(verdicts: list[dict]) -> dict:
    found = target("models.py:Net", {})
    found["head"]["findings"] = verdicts
    return found


def claim(rule: str, line: int, message: str = "static message") -> dict:
    return {"rule": rule, "path": "models.py", "line": line, "end_line": line, "class": "Net", "slug": "some-rule",
            "message": message}


def test_confirmed_and_not_reproduced_findings_are_commented_on_their_line_and_undecided_ones_are_not():
    from bot.smoke import verdict_comments

    claims = {"models.py": [claim("TR513", 4), claim("TR302", 6), claim("TR401", 8), claim("TR403", 40)]}
    found = verdict_target([
        {"rule": "TR513", "path": "models.py", "line": 4, "verdict": "confirmed", "evidence": "ran with `p=0.3`"},
        {"rule": "TR302", "path": "models.py", "line": 6, "verdict": "refuted", "evidence": "all registered"},
        {"rule": "TR401", "path": "models.py", "line": 8, "verdict": "undecided", "evidence": "no class dim"},
        {"rule": "TR403", "path": "models.py", "line": 40, "verdict": "confirmed", "evidence": "not in the diff"},
        {"rule": "TR513", "path": "models.py", "line": 9, "verdict": "confirmed", "evidence": "no such finding"}])
    comments = verdict_comments(run(found), claims, {"models.py": parse_file_patch("models.py", PATCH)})
    comments.sort(key=lambda c: c["line"])
    assert [(c["line"], c["body"].split("**")[3]) for c in comments] == [
        (4, "Confirmed by running"), (6, "Not reproduced by running")]
    assert "The static finding stands" in comments[1]["body"] and "stands" not in comments[0]["body"]
    assert len({parse_smoke_fingerprint(c["body"]) for c in comments}) == 2
    summary = plan_smoke_check_run(run(found), "a" * 40, claims).summary
    assert "**Not decided by running** (TR401 some-rule at `models.py:8`" in summary
    assert "no such finding" not in summary  # a verdict on a line the static engine did not flag is not shown


def test_verdict_evidence_from_the_pull_request_is_escaped():
    from bot.smoke import verdict_comments

    hostile = "`Net`'s output @octo-org/admins <img src=x onerror=alert(1)> [link](http://evil.example)"
    found = verdict_target([{"rule": "TR513", "path": "models.py", "line": 4, "verdict": "confirmed",
                             "evidence": hostile}])
    [comment] = verdict_comments(run(found), {"models.py": [claim("TR513", 4)]},
                                 {"models.py": parse_file_patch("models.py", PATCH)})
    assert "<img" not in comment["body"] and "@octo-org/admins" not in comment["body"]
    assert "http://evil.example" not in comment["body"]


def test_only_findings_a_model_run_decides_are_sent_to_the_runner():
    from bot.smoke import static_claims

    source = '''import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=1)


def evaluate(model, x, y, logits):
    net = Net()
    first = F.nll_loss(net(x), y)  # probabilities into NLLLoss: no floor to show
    second = F.cross_entropy(F.softmax(logits, dim=1), y)  # the softmax is the script's, not a model's
    third = F.cross_entropy(net(x), y)
    return first + second + third
'''
    [only] = static_claims({"eval.py": source})["eval.py"]
    assert (only["rule"], only["line"], only["forward_of"]) == ("TR401", 18, "Net")


def test_a_confirmation_on_a_failures_line_is_said_in_that_comment():
    from bot.smoke import VERDICT_MARK, said_once

    failure = {"path": "train.py", "line": 10, "side": "RIGHT",
               "body": "🔥 **smoke** · `train.py:step` failed\n\n- **zero-grad**: ...\n\n<!-- torchreview:smoke=aaa -->"}
    confirmed = {"path": "train.py", "line": 10, "side": "RIGHT",
                 "body": f"{VERDICT_MARK} **smoke** · **Confirmed by running** (TR101 ...)\n\n<!-- torchreview:smoke=bbb -->"}
    refuted = {"path": "train.py", "line": 10, "side": "RIGHT",
               "body": f"{VERDICT_MARK} **smoke** · **Not reproduced by running** (TR104 ...)\n\n"
                       "<!-- torchreview:smoke=ccc -->"}
    elsewhere = dict(confirmed, line=20, body=confirmed["body"].replace("bbb", "ddd"))
    comments = said_once([dict(failure)], [confirmed, refuted, elsewhere])
    assert [c["line"] for c in comments] == [10, 10, 20]
    merged = comments[0]["body"]
    assert "zero-grad" in merged and "**Confirmed by running** (TR101" in merged
    assert merged.endswith("<!-- torchreview:smoke=aaa -->") and "bbb" not in merged
    assert comments[1] is refuted and comments[2] is elsewhere
