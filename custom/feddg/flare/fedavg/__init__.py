"""FedAvg as the papers compare against it: the sites' models averaged with weights N_k / N (data size)."""
