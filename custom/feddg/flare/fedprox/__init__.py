"""FedProx (Li et al., MLSys 2020): FedAvg whose sites add the proximal term mu/2 ||w - w_global||^2 to their loss."""
