"""``--optimizer adam_sparsity``'s settings in the unit and e2e tests, and its log line."""
import re


LR, SPARSITY_LR, WD = 1e-3, 0.05, 0.01


def by_id(params):
    return [id(p) for p in params]


#: adam_sparsity's log line of a non-empty gate group (the CUDA tests look for it too)
GATE_GROUP_LOG = re.compile(r"sparsity control, [^:]*: [1-9][\d,]* parameters in [1-9]\d* tensors at --sparsity-lr ")
