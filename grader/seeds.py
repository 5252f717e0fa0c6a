"""The seed of an exercise's questions: ``HMAC(secret, student, assignment, exercise, digest)``.

The graded run (``grader.verify.AskQuestions``) passes the course secret and the submission's
digest; a learner's own check passes their self-check secret (``grader.selfcheck``). Here,
apart from the grading stack, so that the check of one exercise in a learner's kernel
(``grader.kernelcheck``) imports no nbgrader.
"""
from __future__ import annotations

import hashlib
import hmac


def seed_for(secret: bytes, student: str, assignment: str, exercise: str, digest: str) -> int:
    message = "\0".join([student, assignment, exercise, digest]).encode()
    return int.from_bytes(hmac.new(secret, message, hashlib.sha256).digest()[:8], "little")
