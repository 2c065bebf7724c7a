"""On-policy distillation: the student samples, a teacher scores every token, and the student learns
where it and the teacher disagree.

For each token y_t of a completion the student drew, with s_t = log p_student(y_t | ...) (the
sampler's log-prob) and t_t = log p_teacher(y_t | ...) (the teacher's ``compute_logprobs`` of the same
tokens), the advantage is

    A_t = -kl_coef * (s_t - t_t) + task_advantage

Over a completion, mean(s_t - t_t) estimates the reverse KL, KL(student || teacher), on the student's own
samples; the importance-sampling loss with these per-token advantages lowers it: tokens the teacher
finds likelier than the student are pushed up, the others down. ``task_advantage`` adds a reward's
advantage (GRPO's, ``advantages.group_advantages``) to every token of the completion, 0 by default.
The loop is GRPO's with another source of advantages; the loss is the same ``importance_sampling``.

Per-token log-probs compare only over the same tokens, so the teacher must share the student's
tokenizer: ``check_same_tokenizer`` refuses any other before a step runs.

Torch-free: the session loops (SDK v3 environment) and the job scripts import it alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from common.contract import UserError


def distillation_advantages(
    student_logprobs: Sequence[float],
    teacher_logprobs: Sequence[float],
    kl_coef: float = 1.0,
    task_advantage: float = 0.0,
) -> list[float]:
    """One completion's per-token advantages (see the module docstring), one per sampled token."""
    if len(student_logprobs) != len(teacher_logprobs):
        raise ValueError(
            f"{len(student_logprobs)} student log-probs against {len(teacher_logprobs)} teacher log-probs: the "
            "teacher must score exactly the tokens the student sampled"
        )
    if not (math.isfinite(kl_coef) and kl_coef >= 0 and math.isfinite(task_advantage)):
        raise ValueError(f"kl_coef ({kl_coef}) must be finite and >= 0, task_advantage ({task_advantage}) finite")
    advantages = []
    for index, (student, teacher) in enumerate(zip(student_logprobs, teacher_logprobs, strict=True)):
        if not (math.isfinite(student) and math.isfinite(teacher)):
            raise ValueError(f"token {index}: log-probs {student} (student) and {teacher} (teacher) must be finite")
        advantages.append(-kl_coef * (student - teacher) + task_advantage)
    return advantages


def reverse_kl(student_logprobs: Sequence[float], teacher_logprobs: Sequence[float]) -> float:
    """The per-token estimate of KL(student || teacher) on the student's samples: mean(s_t - t_t)."""
    if not student_logprobs:
        return 0.0
    return sum(s - t for s, t in zip(student_logprobs, teacher_logprobs, strict=True)) / len(student_logprobs)


def check_same_tokenizer(student_tokenizer, teacher_tokenizer) -> None:
    """Refuse a teacher whose tokenizer maps text to other ids than the student's, before any step."""
    student, teacher = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    differing = sorted(
        (token for token in student.keys() | teacher.keys() if student.get(token) != teacher.get(token)),
        key=lambda token: (student.get(token, teacher.get(token, 0)), token),
    )
    specials = ("eos_token_id", "pad_token_id", "bos_token_id")
    special_differs = [
        n for n in specials if getattr(student_tokenizer, n, None) != getattr(teacher_tokenizer, n, None)
    ]
    if differing or special_differs:
        shown = ", ".join(repr(token) for token in differing[:5])
        raise UserError(
            f"The teacher's tokenizer is not the student's ({len(differing)} tokens map to other ids"
            + (f", e.g. {shown}" if shown else "")
            + (f"; {', '.join(special_differs)} differ" if special_differs else "")
            + "): per-token log-probs compare only over the same tokens. Choose a teacher of the student's "
            "model family (a checkpoint trained from the same base model)."
        )
