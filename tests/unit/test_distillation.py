"""Word-level knowledge distillation (Kim & Rush 2016; Hinton et al. 2015): the KD term's closed forms, the frozen
teacher, and the criterion's distillation options checked before anything loads."""
import math

import pytest
import torch
import torch.nn.functional as F

from fairseq_sparse.criterions.label_smoothed_cross_entropy_with_sparsity import distillation_settings
from fairseq_sparse.modules.distillation import FrozenTeacher, word_kd_loss

PAD = 1


def test_kd_is_the_kl_divergence_summed_over_real_tokens():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 3, 7), torch.randn(2, 3, 7)
    target = torch.tensor([[5, 6, 2], [4, 2, PAD]])
    p = F.softmax(teacher, -1)
    kl = (p * (p.log() - F.log_softmax(student, -1))).sum(-1)
    expected = kl[target.ne(PAD)].sum()
    assert torch.allclose(word_kd_loss(student, teacher, target, PAD), expected, atol=1e-6)
    assert float(word_kd_loss(teacher, teacher, target, PAD)) == pytest.approx(0.0, abs=1e-6)


def test_temperature_softens_both_and_scales_by_its_square():
    torch.manual_seed(1)
    student, teacher = torch.randn(4, 9), torch.randn(4, 9)
    target = torch.full((4,), 5)
    t = 2.0
    assert torch.allclose(word_kd_loss(student, teacher, target, PAD, t),
                          t * t * word_kd_loss(student / t, teacher / t, target, PAD), atol=1e-6)


def test_kd_gradient_is_student_minus_teacher_probabilities():
    """d KL(p_t || p_s) / d z_s = p_s - p_t (Hinton et al. 2015 Eq. 2 at T = 1)."""
    torch.manual_seed(2)
    student = torch.randn(3, 5, requires_grad=True)
    teacher = torch.randn(3, 5)
    word_kd_loss(student, teacher, torch.full((3,), 4), PAD).backward()
    assert torch.allclose(student.grad, F.softmax(student, -1) - F.softmax(teacher, -1), atol=1e-6)


def test_kd_in_float32_from_half_logits():
    student, teacher = torch.randn(2, 6).half(), torch.randn(2, 6).half()
    out = word_kd_loss(student, teacher, torch.full((2,), 4), PAD)
    assert out.dtype == torch.float32 and math.isfinite(float(out))


def test_frozen_teacher_is_eval_without_gradients_and_follows_the_student():
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(3, 4)

        def forward(self, x):
            return self.proj(x), None

    model = Tiny().train()
    teacher = FrozenTeacher(model)
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    student_param = torch.zeros(1, dtype=torch.float64)
    logits = teacher.logits({"x": torch.randn(2, 3, dtype=torch.float64)}, student_param)
    assert logits.dtype == torch.float64 and not logits.requires_grad


@pytest.mark.parametrize("teacher,weight,temperature,message", [
    (None, 0.3, None, "--distill-weight is set but --distill-teacher is not"),
    (None, None, 2.0, "--distill-temperature is set but --distill-teacher is not"),
    ("t.pt", 1.5, None, "--distill-weight must lie in [0, 1], got 1.5"),
    ("t.pt", -0.1, None, "--distill-weight must lie in [0, 1]"),
    ("t.pt", float("nan"), None, "--distill-weight must lie in [0, 1], got nan"),
    ("t.pt", None, 0.0, "--distill-temperature must be a finite number > 0"),
    ("t.pt", None, float("inf"), "--distill-temperature must be a finite number > 0"),
])
def test_bad_distillation_options_are_refused(teacher, weight, temperature, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        distillation_settings(teacher, weight, temperature)


def test_distillation_defaults():
    assert distillation_settings("t.pt", None, None) == {"weight": 0.5, "temperature": 1.0}
    assert distillation_settings(None, None, None) == {}

