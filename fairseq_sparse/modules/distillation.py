"""Word-level knowledge distillation (Hinton, Vinyals & Dean 2015; Kim & Rush 2016 Sec. 3.1 for NMT).

The student learns the teacher's whole output distribution at every target position, not only the
reference word: KD = T^2 * KL(p_teacher^T || p_student^T), with p^T = softmax(logits / T). The T^2 keeps
the gradient's scale independent of the temperature (Hinton et al. 2015 Sec. 2). It is mixed with the
label-smoothed cross-entropy as (1 - w) * CE + w * KD (Kim & Rush 2016 Eq. 4, with w their alpha).
"""
import torch
import torch.nn.functional as F
from torch import Tensor


def word_kd_loss(student_logits: Tensor, teacher_logits: Tensor, target: Tensor, pad_idx: int,
                 temperature: float = 1.0) -> Tensor:
    """Sum over the non-padding target positions of T^2 * KL(p_teacher^T || p_student^T).

    ``student_logits`` and ``teacher_logits``: [B, T, V] (or [N, V]); ``target``: [B, T] (or [N]), only its
    padding is read. Computed in float32 whatever the logits' precision (fp16 / --amp)."""
    student = F.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    kl = (teacher.exp() * (teacher - student)).sum(-1)  # per position, >= 0
    return kl.masked_fill(target.eq(pad_idx), 0.0).sum() * temperature ** 2


class FrozenTeacher:
    """A teacher model held outside the student's module tree (so it is neither optimised nor saved in
    checkpoints): eval mode, no gradients, moved to the student's device and precision at first use."""

    def __init__(self, model: torch.nn.Module):
        model.eval()
        model.requires_grad_(False)
        self.model = model

    def logits(self, net_input: dict, student_param: Tensor) -> Tensor:
        """The teacher's output logits on ``net_input``, the teacher on the device and in the dtype of the
        student's parameters (``--fp16``: half; ``--amp``: float32 under the same autocast)."""
        param = next(self.model.parameters())
        if param.device != student_param.device or param.dtype != student_param.dtype:
            self.model.to(device=student_param.device, dtype=student_param.dtype)
        with torch.no_grad():
            return self.model(**net_input)[0]
