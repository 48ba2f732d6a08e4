"""The uniform control: FedAvg with equal site weights, theta = (1/K) sum_k theta_k over the sites present in a
round. It is GA's step-0 control (GA with ``ga.step_size: 0`` keeps its uniform start weights) and separates
gradient alignment (which averages its corrected updates uniformly) from FedAvg's data-size weighting."""
