"""FedProx's part of a job: FedAvg's aggregation with ``train.fedprox_mu`` set, which the sites' training loop turns
into NVFlare's ``PTFedProxLoss`` (:func:`feddg.training.train_epochs`).

mu = 0.01: the middle of the grid {0.001, 0.01, 0.1, 1} of the FedProx paper (section 5.2), chosen before any run
and not tuned on the held-out sites (tuning it there would tune on the test data). Scale: after 10 local epochs at
the CPU default, the sum of squared weight changes of the 0.5 M-parameter U-Net is of order 1, so the term is about
0.005 against a Dice loss between 0 and 1, and its gradient pulls each weight back by 1 % of its drift per unit of
learning rate: a gentle restraint, as FedProx intends. Change it with ``--set train.fedprox_mu=...``.
"""

from __future__ import annotations

from feddg.flare.method_spec import MethodPart

FEDPROX_MU = 0.01

PART = MethodPart(name="fedprox", experiment={"train": {"fedprox_mu": FEDPROX_MU}})
