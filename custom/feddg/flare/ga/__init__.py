"""FedDG-GA (Zhang et al., CVPR 2023): generalization adjustment of the aggregation weights on the server; the math
is in :mod:`feddg.methods.ga`."""
