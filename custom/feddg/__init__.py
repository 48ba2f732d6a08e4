"""FedDG on NVIDIA FLARE: federated domain generalization for medical image segmentation."""

__version__ = "0.2.0"
